// See master_format.h.
#include "optim/master_format.h"

#include "util/error.h"

namespace shardlm::optim {

MasterRounding parse_master_format(const std::string& precision, const std::string& rounding) {
  if (precision == "fp32") return MasterRounding::None;
  if (precision != "bf16")
    fail("optimizer.master_precision must be \"fp32\" or \"bf16\", got \"", precision, "\"");
  if (rounding == "kahan") return MasterRounding::Kahan;
  if (rounding == "stochastic") return MasterRounding::Stochastic;
  if (rounding == "nearest") return MasterRounding::Nearest;
  fail("optimizer.master_rounding must be \"kahan\", \"stochastic\" or \"nearest\", got \"", rounding, "\"");
}

const char* master_rounding_name(MasterRounding r) {
  switch (r) {
    case MasterRounding::None: return "none (fp32 masters)";
    case MasterRounding::Nearest: return "nearest";
    case MasterRounding::Kahan: return "kahan";
    case MasterRounding::Stochastic: return "stochastic";
  }
  return "?";
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * c[0], p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k = {k[0] + kW0, k[1] + kW1};
  }
  return c;
}

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 16777619u;
  }
  return h;
}

}  // namespace shardlm::optim
