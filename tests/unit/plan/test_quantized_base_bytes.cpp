// The planner's bytes of a QLoRA frozen base (plan/quantized_base.h): the hand count for the tiny
// preset, and the same bytes as the 4-bit store the trainer builds from that model's tensors
// (model/quant/quantized_base.h), with and without double quantization.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "model/quant/quantized_base.h"
#include "plan/quantized_base.h"

using namespace shardlm;

// tiny: per layer q, o 4096 (64 blocks of 64), k, v 2048 (32), gate/up/down 11264 (176); 2 layers.
//   NF4: n/2 + 4 per block:  q, o 2304;  k, v 1152;  gate/up/down 6336;  per layer 25920
//   double quant: n/2 + 1 per block + 4 per 256 blocks + 4:  q, o 2120;  k, v 1064;  gate/up/down 5816;
//   per layer 23816
//   the rest in its dtype: embedding and head 8192 each, 5 norms of 64: 16704 elements
TEST(QuantizedBaseBytes, TinyPresetIsTheHandCountAndTheStoresBytes) {
  const auto cfg = model::preset("tiny");
  const auto shape = model::describe(cfg);
  EXPECT_EQ(plan::four_bit_linear_bytes(shape, false), 2 * 25920);
  EXPECT_EQ(plan::four_bit_linear_bytes(shape, true), 2 * 23816);
  EXPECT_EQ(plan::four_bit_linear_bf16_bytes(shape), 2 * 2 * 46080);
  EXPECT_EQ(plan::frozen_base_bytes(shape, {4, false, false}), 4 * 108864);
  const model::Llama llama(cfg, 1, at::kFloat);
  for (bool dq : {false, true}) {
    const int64_t want = 2 * (dq ? 23816 : 25920) + 4 * 16704;
    EXPECT_EQ(plan::frozen_base_bytes(shape, {4, true, dq}), want);
    const model::quant::QuantizedFrozenBase store(llama.named_tensors(), {model::quant::FourBitType::NF4, dq, at::kFloat});
    EXPECT_EQ(store.bytes(), want);
    EXPECT_EQ(store.quantized_bytes(), plan::four_bit_linear_bytes(shape, dq));
    EXPECT_EQ(store.quantized_bf16_bytes(), plan::four_bit_linear_bf16_bytes(shape));
  }
}
