// See crc32c.h. The SSE4.2 crc32 instruction where the CPU has it (chosen at run time, so the
// program still runs on any x86-64), else table-driven slice-by-8. Every rank checksums the shard
// it wrote and the shards it verifies, so the speed of this loop is part of a save's and a resume's
// time.
#include "util/crc32c.h"

#include <array>
#include <cstring>
#include <fstream>
#include <vector>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "util/error.h"

namespace shardlm {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  return t;
}

#if defined(__x86_64__)
// The crc32 instruction computes CRC-32C itself, 8 bytes at a time.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  static const Tables t = make_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    const uint32_t lo = crc ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return crc32c_sse42(crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_portable(crc, data, n);
}

uint32_t crc32c_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '", path, "' to check its checksum");
  std::vector<char> buf(4 << 20);
  uint32_t crc = 0;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32c(crc, buf.data(), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) fail("error reading '", path, "' to check its checksum");
  return crc;
}

}  // namespace shardlm
