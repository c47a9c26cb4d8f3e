// bf16 master weights (optimizer.master_precision "bf16"): under bf16 compute the bf16 working shard
// is the master, so the fp32 copy (4 bytes per parameter) goes away. The AdamW update is still computed
// in fp32 element by element (adamw.cpp step_compact); only how its result returns to bf16 differs:
//   nearest     round to nearest even (plain bf16 training: model.to(bfloat16) with torch's AdamW);
//               small updates are lost where |update| < half a bf16 ulp of the weight.
//   kahan       torchdistx's AnyPrecisionAdamW(use_kahan_summation=True): a bf16 compensation buffer c
//               (optimizer state, 2 bytes per parameter) carries what rounding lost:
//                 p ← bf16(p·(1 − lr·wd))        (decoupled decay, in bf16 as p.data.mul_ does)
//                 c ← bf16(c + update)            (compensation.addcdiv_(m, denom, value=-step_size))
//                 t ← p;  p ← bf16(p + c);  c ← bf16(c + bf16(t − p))   (the swap)
//   stochastic  torchao's _fp32_to_bf16_sr (AdamW(bf16_stochastic_round=True)): the fp32 result x
//               (decay included) rounds away from zero with probability (low 16 bits of x) / 2^16:
//               a random 16-bit r, away iff r < low16(x). torchao draws r from torch.randint; here r
//               is a counter-based function of (seed, optimizer step, parameter name, element index
//               in the whole parameter), so every ZeRO stage, rank count and pipeline split draws the
//               same r for the same element, a resharded resume continues the same stream, and the
//               trajectory is the one-process trajectory bit for bit.
// The generator (stochastic_bits): Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11; Random123's constants), key = (seed low 32 bits, seed high 32 bits), counter =
// (element low 32 bits, element high 32 bits, step, FNV-1a-32 of the parameter's name); r = the high 16
// bits of the first output word. Tested against Random123's known-answer vectors.
#pragma once
#include <c10/util/BFloat16.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

namespace shardlm::optim {

// None: fp32 masters (the default); the others are bf16 masters with that rounding.
enum class MasterRounding { None, Nearest, Kahan, Stochastic };
// From optimizer.master_precision ("fp32" | "bf16") and optimizer.master_rounding.
MasterRounding parse_master_format(const std::string& precision, const std::string& rounding);
const char* master_rounding_name(MasterRounding r);

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
uint32_t fnv1a32(const std::string& s);
inline uint16_t stochastic_bits(uint64_t seed, int64_t step, uint32_t name_hash, int64_t element) {
  const auto e = static_cast<uint64_t>(element);
  const auto out = philox4x32_10({static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32),
                                  static_cast<uint32_t>(step), name_hash},
                                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return static_cast<uint16_t>(out[0] >> 16);
}

// torchao's _fp32_to_bf16_sr with the random 16 bits given.
inline c10::BFloat16 round_stochastic(float x, uint16_t r) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t toward_zero = bits & 0xFFFF0000u;
  bits = r < (bits & 0xFFFFu) ? toward_zero + 0x10000u : toward_zero;
  return c10::BFloat16(static_cast<uint16_t>(bits >> 16), c10::BFloat16::from_bits());
}

}  // namespace shardlm::optim
