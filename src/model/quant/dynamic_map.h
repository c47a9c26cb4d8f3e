// bitsandbytes' 8-bit dynamic code (create_dynamic_map, pinned bitsandbytes 0.50.2) and its
// block-wise quantization as bitsandbytes' CPU backend computes it. Two users share the code maps:
// the 8-bit optimizer states (optim/quantized_state.h, whose quantizer follows the CUDA kernel) and
// QLoRA's double quantization of the 4-bit absmax values (four_bit.h), which must equal what
// bitsandbytes computes on the CPU. It lives in model/ so that both, and the frozen 4-bit base of the
// model's linears, can reach it (layers only include layers below them).
//
// bitsandbytes' CPU quantize_blockwise (csrc/cpu_ops.cpp quantize_cpu_impl), read in its source:
//   - absmax per block of `blocksize` elements (the last block partial); a block whose absmax is 0
//     gets code 0 everywhere (the code of -0.99296875, times absmax 0);
//   - otherwise x · (1 / absmax), clamped to [-1, 1], is mapped to an index of a 65536-entry table,
//     uint16((v + 1) · 0.5 · 65535 + 0.5), whose entry is the number of midpoints between neighbouring
//     codes that lie below -1 + 2i / 65535 (the nearest code of the table's grid point, not of x).
// Its dequantize_blockwise: code[q] · absmax in float32.
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <utility>

namespace shardlm::model::quant {

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 256 sorted floats.
const std::array<float, 256>& dynamic_map(bool is_signed);

// bitsandbytes' CPU quantize_blockwise of a float32 tensor with the signed dynamic map: codes (uint8,
// same numel) and one float32 absmax per block of `blocksize`.
std::pair<at::Tensor, at::Tensor> quantize_blockwise_cpu(const at::Tensor& values, int64_t blocksize);
// Its dequantize_blockwise: float32, code · absmax.
at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize);

}  // namespace shardlm::model::quant
