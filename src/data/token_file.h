// Token files on disk: llm.c's .bin format (what `shardlm prepare` and llm.c's scripts write) and
// bare uint16 arrays (what nanoGPT's prepare.py writes), so a run can replay either project's data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::data {

enum class TokenFormat { LlmcBin, RawU16 };

// "llmc" | "raw_u16" (the spelling used by the data.format config key).
TokenFormat parse_token_format(const std::string& name);
const char* token_format_name(TokenFormat format);

// llm.c .bin layout: 256 little-endian int32 header words {magic 20240520, version 1, token count,
// 0...}, then the tokens as little-endian uint16.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// Reads the whole file; throws shardlm::Error for a missing, malformed or empty file.
std::vector<uint16_t> read_tokens(const std::string& path, TokenFormat format);

// Writes an llm.c .bin file atomically (temporary file in the same folder, then rename), so a
// reader never sees half a file and an interrupted prepare leaves the old file intact.
void write_llmc_tokens(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace shardlm::data
