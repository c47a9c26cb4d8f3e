// See quantized_state.h.
#include "optim/quantized_state.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/quant/dynamic_map.h"
#include "util/error.h"

namespace shardlm::optim {

StatePrecision parse_state_precision(const std::string& name) {
  if (name == "fp32") return StatePrecision::FP32;
  if (name == "bf16") return StatePrecision::BF16;
  if (name == "8bit") return StatePrecision::Int8;
  fail("optimizer.state_precision must be \"fp32\", \"bf16\" or \"8bit\", got \"", name, "\"");
}

const char* state_precision_name(StatePrecision p) {
  switch (p) {
    case StatePrecision::FP32: return "fp32";
    case StatePrecision::BF16: return "bf16";
    case StatePrecision::Int8: return "8bit";
  }
  return "?";
}

const std::array<float, 256>& dynamic_map(bool is_signed) { return model::quant::dynamic_map(is_signed); }

namespace {

// For each 16-bit prefix of a float's bits, the number of midpoints below the smallest float with
// that prefix (NaN prefixes: 0). Every float x with the prefix has at least that many midpoints
// below it, so counting on from there is exact; a prefix spans 2^-7 of its magnitude, which holds at
// most a few midpoints of the dynamic maps, so the count takes a step or two instead of a binary
// search (the 8-bit update runs this twice per element).
std::array<uint8_t, 65536> make_start(const std::array<float, 255>& mid) {
  std::array<uint8_t, 65536> start{};
  for (uint32_t k = 0; k < 65536; ++k) {
    const uint32_t bits = (k << 16) | ((k & 0x8000) ? 0xFFFFu : 0u);  // the prefix's smallest value
    float lowest;
    std::memcpy(&lowest, &bits, sizeof lowest);
    start[k] = static_cast<uint8_t>(std::lower_bound(mid.begin(), mid.end(), lowest) - mid.begin());
  }
  return start;
}

}  // namespace

Quantizer::Quantizer(bool is_signed) : map_(dynamic_map(is_signed)), signed_(is_signed) {
  for (int k = 0; k < 255; ++k) mid_[k] = (map_[k] + map_[k + 1]) * 0.5f;
  zero_code_ = static_cast<uint8_t>(std::find(map_.begin(), map_.end(), 0.0f) - map_.begin());
  static const auto signed_start = make_start(Quantizer::midpoints(true));
  static const auto unsigned_start = make_start(Quantizer::midpoints(false));
  start_ = is_signed ? &signed_start : &unsigned_start;
}

std::array<float, 255> Quantizer::midpoints(bool is_signed) {
  const auto& map = dynamic_map(is_signed);
  std::array<float, 255> mid;
  for (int k = 0; k < 255; ++k) mid[k] = (map[k] + map[k + 1]) * 0.5f;
  return mid;
}

uint8_t Quantizer::quantize(float value, float absmax) const {
  if (absmax == 0.0f) return zero_code_;
  const float x = value / absmax;
  // The number of midpoints below x: the nearest code, a tie going to the lower one.
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int c = (*start_)[bits >> 16];
  while (c < 255 && mid_[c] < x) ++c;
  // kernels.cu: "make sure state1 term has still the same sign after quantization".
  if (signed_ && std::signbit(map_[c]) != std::signbit(value)) c += value > 0.0f ? 1 : -1;
  return static_cast<uint8_t>(c);
}

std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& values, bool is_signed, int64_t first) {
  const auto v = values.to(at::kFloat).contiguous().view({-1});
  const int64_t n = v.numel(), nb = blocks_touched(first, n), b0 = first_block(first);
  auto codes = at::empty({n}, at::kByte);
  auto absmax = at::zeros({nb}, at::kFloat);
  const Quantizer q(is_signed);
  const float* x = v.data_ptr<float>();
  float* a = absmax.data_ptr<float>();
  uint8_t* c = codes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) a[(first + i) / kQuantBlock - b0] = std::max(a[(first + i) / kQuantBlock - b0], std::fabs(x[i]));
  for (int64_t i = 0; i < n; ++i) c[i] = q.quantize(x[i], a[(first + i) / kQuantBlock - b0]);
  return {codes.view(values.sizes()), absmax};
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, bool is_signed, int64_t first) {
  const auto c = codes.contiguous().view({-1});
  const auto a = absmax.to(at::kFloat).contiguous();
  const int64_t n = c.numel(), b0 = first_block(first);
  if (a.numel() != blocks_touched(first, n))
    fail("dequantize_blockwise: ", a.numel(), " absmax values for ", blocks_touched(first, n), " blocks");
  auto out = at::empty({n}, at::kFloat);
  const auto& map = dynamic_map(is_signed);
  const uint8_t* cp = c.data_ptr<uint8_t>();
  const float* ap = a.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = map[cp[i]] * ap[(first + i) / kQuantBlock - b0];
  return out.view(codes.sizes());
}

}  // namespace shardlm::optim
