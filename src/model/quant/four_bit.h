// QLoRA's 4-bit storage of a frozen weight: bitsandbytes' NF4 and FP4 block-wise quantization, with
// and without double quantization, bit for bit as the pinned bitsandbytes (0.50.2) computes it on the
// CPU (tests/reference/make_4bit_golden.py, tests/unit/model/test_four_bit.cpp). The frozen base of
// a QLoRA run keeps its targeted linears in this form and dequantizes one at a time (quant_linear.h).
//
// bitsandbytes, read in its source (functional.py quantize_4bit / dequantize_4bit; the CPU backend
// quantizes through backends/default/ops.py and dequantizes in csrc/cpu_ops.cpp):
//   - the weight is flattened (row-major) and cut into blocks of 64; absmax = the largest |x| of a
//     block, in float32 (16-bit inputs are widened exactly);
//   - a whole block scales by the reciprocal, x · fl(1 / max(absmax, 1e-38)); the partial last block
//     divides, x / max(absmax, 1e-38), and stores that clamped absmax (1e-38 for a block of zeros);
//     both clamp to [-1, 1];
//   - the code is torch.bucketize over the midpoints of the sorted code table: the number of
//     midpoints strictly below the value (a tie goes to the lower code). FP4's table holds +0 and -0:
//     a tiny positive value gets code 8 (-0), a tiny negative one code 0 (+0);
//   - two codes a byte, the first element in the high nibble; an odd count pads a code of 0.0;
//   - double quantization: offset = mean of the absmax values (torch.mean, float32); the absmax
//     values minus the offset go through the CPU 8-bit dynamic blockwise quantization in blocks of
//     256 (dynamic_map.h), giving one uint8 per block of 64 and one float32 per block of 256;
//   - dequantize: absmax = fl(fl(code8 · absmax2) + offset) when double-quantized; value =
//     fl(code4 · absmax) in float32, then rounded to nearest even into the output dtype. FP4's code 8
//     dequantizes to -0 (its C++ kernel) unless the last dimension is odd (its Python fallback: +0).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::model::quant {

enum class FourBitType { NF4, FP4 };
FourBitType parse_four_bit_type(const std::string& name);  // "nf4" | "fp4"
const char* four_bit_type_name(FourBitType t);

constexpr int64_t kFourBitBlock = 64;   // bitsandbytes' default blocksize for 4-bit (and the QLoRA one)
constexpr int64_t kNestedBlock = 256;   // the block of the double-quantized absmax values

// The 16 float32 values of NF4 or FP4 (bitsandbytes' get_4bit_type), by code.
const float* four_bit_code(FourBitType t);

struct FourBit {
  FourBitType type = FourBitType::NF4;
  bool double_quant = false;
  std::vector<int64_t> shape;            // the weight's shape
  at::ScalarType dtype = at::kFloat;     // the weight's dtype before quantization
  at::Tensor packed;                     // uint8 [ceil(numel / 2)]
  at::Tensor absmax;                     // float32 [blocks], or uint8 [blocks] with double_quant
  at::Tensor absmax2;                    // double_quant: float32 [ceil(blocks / 256)]
  float offset = 0.0f;                   // double_quant: the mean subtracted before quantizing absmax

  int64_t numel() const;
  // The bytes this form keeps: codes, absmax (and absmax2 and the offset).
  int64_t bytes() const;
};

// Quantizes a float32, bfloat16 or float16 tensor (any device; computed where it lives).
FourBit quantize_4bit(const at::Tensor& weight, FourBitType type, bool double_quant);
// The float32 absmax per block of 64 (undoing double quantization).
at::Tensor absmax_f32(const FourBit& q);
// The dequantized weight in `dtype` (float32, bfloat16 or float16), shaped like the original.
at::Tensor dequantize_4bit(const FourBit& q, at::ScalarType dtype);

// Bytes per element of the 4-bit form for n elements, the formula the planner uses:
// n/2 (rounded up) + 4 per block of 64, or + 1 per block of 64 + 4 per block of 256 + 4 (the offset).
int64_t four_bit_bytes(int64_t n, bool double_quant);

}  // namespace shardlm::model::quant
