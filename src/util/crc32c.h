// CRC-32C (Castagnoli), the checksum sharded checkpoints record for every shard file, so a
// truncated or bit-flipped file is found and named before its bytes are trusted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

// Continues `crc` (0 to start) over n bytes (with the CPU's crc32 instruction where it has one).
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// The same, table-driven on every CPU (the fallback; tests compare the two).
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);
// The CRC-32C of a whole file, read in 4 MiB blocks; fail()s when the file cannot be read.
uint32_t crc32c_file(const std::string& path);

}  // namespace shardlm
