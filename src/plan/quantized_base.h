// The planner's bytes for a frozen base (LoRA / QLoRA, model/lora.h): each frozen tensor at the
// compute dtype's bytes, or, with quantization.load_in_4bit, the decoder linears at bitsandbytes'
// 4-bit bytes (model/quant/four_bit.h four_bit_bytes: 0.5 byte per weight + a float32 absmax per 64;
// with double quantization a uint8 per 64 + a float32 per 256 + the offset). The same functions
// decide which tensors are 4-bit and how many bytes they take as the store the trainer builds
// (model/quant/quantized_base.h), so plan and measurement agree byte for byte. At ZeRO stage 3 a rank
// keeps its piece of each tensor (sharded_frozen_base.h's formulas: padded like a ZeRO-3 unit, or
// whole blocks of 64 of the 4-bit storage).
#pragma once
#include <cstdint>

#include "model/llama.h"

namespace shardlm::plan {

struct FrozenBaseFormat {
  int64_t compute_bytes = 2;  // bytes per element of the tensors kept in their dtype
  bool four_bit = false;      // quantization.load_in_4bit
  bool double_quant = false;  // quantization.bnb_4bit_use_double_quant
  int shards = 1;             // ZeRO stage 3: the ranks the base is split over (parallel/zero/sharded_frozen_base.h)
};

// The bytes of the frozen tensors `frozen` (the model's tensors less the adapters' trained ones) one
// rank keeps.
int64_t frozen_base_bytes(const model::ModelShape& frozen, const FrozenBaseFormat& format);
// Of those, the 4-bit tensors' bytes and what they would take in bfloat16.
int64_t four_bit_linear_bytes(const model::ModelShape& frozen, bool double_quant);
int64_t four_bit_linear_bf16_bytes(const model::ModelShape& frozen);

}  // namespace shardlm::plan
