// Compact optimizer-state formats: bitsandbytes' block-wise dynamic 8-bit quantization of the Adam
// moments (the state of bnb.optim.AdamW8bit, pinned bitsandbytes 0.50.2), and bf16 moments. This file
// holds the format itself — the two code maps, the block size, quantize and dequantize — so that
// the optimizer (adamw.cpp), checkpoints and tests share one definition.
//
// bitsandbytes, read in its source (functional.py create_dynamic_map, optim/optimizer.py init_state,
// csrc/kernels.cu kOptimizerStatic8bit2StateBlockwise):
//   - exp_avg uses the signed dynamic map (create_dynamic_map(signed=True)), exp_avg_sq the unsigned
//     one (signed=False); 256 float32 codes each, sorted.
//   - blocks of 256 elements, counted per parameter from its element 0; one float32 absmax per block.
//   - a parameter with fewer than min_8bit_size (4096) elements keeps fp32 moments (decided per
//     parameter, from the whole parameter's size, not a shard's).
//   - each step dequantizes (code value × block absmax), updates in fp32, takes the new block absmax
//     of the updated values and stores the nearest code of value / absmax; for exp_avg a code of the
//     wrong sign is moved one step toward the value's sign (the CUDA kernel's rule).
// The nearest code here is exact (the CUDA kernel's binary search); bitsandbytes' CPU backend
// (0.50.2) instead looks codes up in a 65536-entry table, which differs for some values: the golden
// test (tests/reference/make_adamw8bit_golden.py) states both distances.
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>

namespace shardlm::optim {

// How the optimizer keeps its moments: fp32 (torch.optim.AdamW), bf16, or 8-bit block-quantized
// (bitsandbytes AdamW8bit). Config key optimizer.state_precision.
enum class StatePrecision { FP32, BF16, Int8 };
StatePrecision parse_state_precision(const std::string& name);  // "fp32" | "bf16" | "8bit"
const char* state_precision_name(StatePrecision p);

constexpr int64_t kQuantBlock = 256;         // bitsandbytes' block size for the 8-bit blockwise optimizers
constexpr int64_t kDefaultMin8bitSize = 4096;  // bitsandbytes' min_8bit_size

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), its float32 values.
const std::array<float, 256>& dynamic_map(bool is_signed);

// The code of x / absmax nearest in `map` (ties to the lower code); absmax 0 gives the code of 0.
// signed_fix: exp_avg's rule — the code keeps the value's sign.
class Quantizer {
 public:
  explicit Quantizer(bool is_signed);
  uint8_t quantize(float value, float absmax) const;
  float dequantize(uint8_t code, float absmax) const { return map_[code] * absmax; }
  const std::array<float, 256>& map() const { return map_; }
  static std::array<float, 255> midpoints(bool is_signed);

 private:
  std::array<float, 256> map_;
  std::array<float, 255> mid_;  // midpoints between neighbouring codes
  // Per group of floats sharing their top 16 bits (sign, exponent, 7 mantissa bits): how many
  // midpoints lie below the group's smallest value, where the search for the nearest code starts.
  const std::array<uint8_t, 65536>* start_ = nullptr;
  uint8_t zero_code_ = 0;
  bool signed_;
};

// Block-wise quantization of a float32 tensor whose element 0 is element `first` of a parameter:
// blocks are [b·256, (b+1)·256) of the parameter. Returns codes (uint8, same numel) and one absmax
// per block the range touches, each the largest |value| of the block's elements inside the range.
std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& values, bool is_signed, int64_t first = 0);
at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, bool is_signed, int64_t first = 0);

// Blocks of a parameter touched by its elements [first, first + n).
inline int64_t first_block(int64_t first) { return first / kQuantBlock; }
inline int64_t blocks_touched(int64_t first, int64_t n) {
  return n <= 0 ? 0 : (first + n - 1) / kQuantBlock - first / kQuantBlock + 1;
}

}  // namespace shardlm::optim
