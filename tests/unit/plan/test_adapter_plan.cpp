// The planner's LoRA / QLoRA run (plan/adapters.h): the trainable tensors and units it plans are the
// ones model::Llama::apply_lora leaves; the frozen base's planned bytes are the bytes of the store the
// trainer holds, plain and 4-bit (NF4 with and without double quantization); model states
// are the adapters' only; and the time model drops the frozen linears' dW and adds QLoRA's
// dequantization passes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>

#include "model/llama.h"
#include "model/lora.h"
#include "model/quant/quantized_base.h"
#include "plan/adapters.h"
#include "plan/planner.h"
#include "plan/time_model.h"
#include "util/error.h"

using namespace shardlm;

namespace {

plan::PlanRequest tiny_lora(const model::LoraOptions& o, bool four_bit = false, bool double_quant = false) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.devices = 1;
  r.micro_batch = 2;
  r.seq_len = 32;
  r.precision = "fp32";
  r.lora = true;
  r.lora_options = o;
  r.load_in_4bit = four_bit;
  r.double_quant = double_quant;
  return r;
}

model::LoraOptions options(std::vector<std::string> targets, std::vector<std::string> save = {}) {
  model::LoraOptions o;
  o.r = 4;
  o.lora_alpha = 8;
  if (targets.size() == 1 && targets[0] == "all-linear") o.target_regex = "all-linear";
  else o.target_modules = std::move(targets);
  o.modules_to_save = std::move(save);
  o.rank_pattern = {{"down_proj", 2}};
  return o;
}

}  // namespace

TEST(AdapterPlan, TrainableAndFrozenTensorsAreTheModelsAfterApplyLora) {
  const auto cfg = model::preset("tiny");
  for (const auto& o : {options({}), options({"all-linear"}, {"lm_head"}), options({"o_proj", "down_proj"}, {"embed_tokens"})}) {
    model::Llama llama(cfg, 1, at::kFloat);
    llama.apply_lora(model::resolve_lora(o, cfg), 7);
    const auto shapes = plan::adapter_shapes(cfg, o);
    const auto& params = llama.parameters();
    ASSERT_EQ(shapes.trainable.params.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(shapes.trainable.params[i].first, params[i].name);
      EXPECT_EQ(shapes.trainable.params[i].second, params[i].tensor.sizes().vec()) << params[i].name;
    }
    ASSERT_EQ(shapes.trainable.units.size(), llama.units().size());
    for (size_t u = 0; u < llama.units().size(); ++u) EXPECT_EQ(shapes.trainable.units[u].params, llama.units()[u].params);
    const auto& frozen = *llama.frozen_base();
    ASSERT_EQ(shapes.frozen.params.size(), frozen.size());
    for (size_t k = 0; k < frozen.size(); ++k) {
      EXPECT_EQ(shapes.frozen.params[k].first, frozen.name(k));
      EXPECT_EQ(shapes.frozen.params[k].second, frozen.weight(k).sizes().vec());
    }
    // The frozen base's planned bytes are the store's, plain (fp32) and NF4 with and without double
    // quantization (FP4 stores the same bytes; quantizing is slow, so once, on the default targets).
    EXPECT_EQ(plan::planned_frozen_base_bytes(tiny_lora(o)), frozen.bytes());
    if (!o.target_modules.empty() || !o.target_regex.empty()) continue;
    for (bool dq : {false, true}) {
      const auto store = model::quant::quantize_frozen_base(frozen, {model::quant::FourBitType::NF4, dq, at::kFloat});
      EXPECT_EQ(plan::planned_frozen_base_bytes(tiny_lora(o, true, dq)), store->bytes());
    }
  }
}

TEST(AdapterPlan, ModelStatesAreTheAdaptersAndTheBaseIsApart) {
  // Default targets (q_proj, v_proj) at r = 4 on tiny (hidden 64, 4 heads, 2 KV heads of 16, 2 layers):
  // q: A 4x64 + B 64x4 = 512, v: A 4x64 + B 32x4 = 384, per layer 896; 1792 trainable parameters.
  // fp32 at stage 0: parameter, gradient and two moments, 16 bytes each.
  auto r = tiny_lora(options({}));
  r.zero_stage = 0;
  const auto p = plan::make_plan(r);
  EXPECT_EQ(p.rank_parameters, 1792);
  EXPECT_EQ(p.parameters, r.model.num_parameters());
  const auto& m = p.stages[0].memory;
  EXPECT_EQ(m.model_states(), 16 * 1792);
  EXPECT_EQ(m.frozen_base, 4 * r.model.num_parameters());
  EXPECT_EQ(m.total(), m.model_states() + m.frozen_base + m.activations + m.recompute_peak + m.comm_buffers +
                           m.gathered_peak + m.backward_peak);
  // ZeRO-3 over 2 ranks shards the adapters' states (units below the persistence threshold keep
  // their parameters whole) and the frozen base (every tiny tensor has an even count: no padding),
  // gathering one frozen tensor at a time: the largest, an MLP linear's 176 x 64 fp32 elements (the
  // embedding and head are 128 x 64).
  r.devices = 2;
  r.zero_stage = 3;
  const auto z3 = plan::make_plan(r).stages[0].memory;
  EXPECT_LT(z3.model_states(), m.model_states());
  EXPECT_EQ(z3.frozen_base, m.frozen_base / 2);
  EXPECT_EQ(plan::gathered_frozen_bytes(r, 3, 2), 4 * 176 * 64);
  EXPECT_GE(z3.gathered_peak, plan::gathered_frozen_bytes(r, 3, 2));
  EXPECT_EQ(plan::gathered_frozen_bytes(r, 2, 2), 0);
  // A LoRA run holds far fewer activations than full fine-tuning (frozen products keep no input).
  auto full = r;
  full.lora = false;
  EXPECT_LT(z3.activations, plan::make_plan(full).stages[0].memory.activations);
}

TEST(AdapterPlan, RefusesLayoutsItDoesNotPrice) {
  auto r = tiny_lora(options({}));
  r.devices = 2;
  r.tp = 2;
  EXPECT_THROW(plan::make_plan(r), Error);
  r.tp = 1;
  r.pp = 2;
  EXPECT_THROW(plan::make_plan(r), Error);
  r.pp = 1;
  r.lora_options.target_modules = {"no_such_proj"};
  EXPECT_THROW(plan::make_plan(r), Error);
}

TEST(AdapterPlan, TheTrainersLoraUnderTpPpOrCpIsPlannedAsItsFullFineTuning) {
  auto r = tiny_lora(options({}));
  r.load_in_4bit = true;
  EXPECT_TRUE(plan::as_the_planner_prices(r).lora);  // one process: priced as LoRA
  EXPECT_TRUE(plan::as_the_planner_prices(r).load_in_4bit);
  r.devices = 2;
  for (auto layout : {std::array{2, 1, 1}, std::array{1, 2, 1}, std::array{1, 1, 2}}) {
    r.tp = layout[0];
    r.pp = layout[1];
    r.cp = layout[2];
    const auto priced = plan::as_the_planner_prices(r);
    EXPECT_FALSE(priced.lora);
    EXPECT_FALSE(priced.load_in_4bit);
    EXPECT_EQ(priced.tp, r.tp);
    EXPECT_EQ(priced.pp, r.pp);
    EXPECT_EQ(priced.cp, r.cp);
  }
}

TEST(AdapterPlan, TimeModelDropsTheFrozenWeightProductsAndAddsDequantization) {
  // Products at 1e9 FLOP/s of every shape, everything else free: full fine-tuning's layer products are
  // 3 x 2 T k n FLOPs (forward, dX, dW); a frozen one's 2 x; the adapters' 3 x 2 T r (in + out).
  plan::MachineProfile mp;
  mp.gemm.push_back({"fp32", 64, 64, 64, 1e9});
  mp.attention_forward["fp32"] = mp.attention_backward["fp32"] = 1e30;
  mp.stream_bytes_per_s = 1e30;
  mp.optimizer_elements_per_s = 1e30;
  auto lora = tiny_lora(options({}));
  lora.zero_stage = 0;
  auto full = lora;
  full.lora = false;
  const auto tf = plan::predict_step_time(plan::make_plan(full), 0, mp);
  const auto tl = plan::predict_step_time(plan::make_plan(lora), 0, mp);
  const double T = 64, h = 64, q = 64, kv = 32, f = 176, V = 128, L = 2;
  const double layer = 2 * T * (h * q * 2 + h * kv * 2 + 3 * h * f), head = 2 * T * h * V;
  const double adapters = L * 2 * T * 4 * ((h + q) + (h + kv));
  EXPECT_NEAR(tf.forward_s, (L * layer + head) / 1e9, 1e-12);
  EXPECT_NEAR(tf.backward_s, 2 * (L * layer + head) / 1e9, 1e-12);
  EXPECT_NEAR(tl.forward_s, (L * layer + head + adapters) / 1e9, 1e-12);
  EXPECT_NEAR(tl.backward_s, (L * layer + head + 2 * adapters) / 1e9, 1e-12);  // dX only for the base
  // QLoRA: each decoder linear dequantized once in forward and once in backward, at the stream rate.
  mp.stream_bytes_per_s = 1e9;
  auto qlora = tiny_lora(options({}), true, true);
  qlora.zero_stage = 0;
  const auto tp = plan::predict_step_time(plan::make_plan(lora), 0, mp);
  const auto tq = plan::predict_step_time(plan::make_plan(qlora), 0, mp);
  const double n = L * (h * q * 2 + h * kv * 2 + 3 * h * f);  // 4-bit weights: 2 x 25920 bytes' worth
  const double pass = (n / 2 + n / 64 + 4 * n) / 1e9;
  EXPECT_NEAR(tq.forward_s - tp.forward_s, pass, 1e-12);
  EXPECT_NEAR(tq.backward_s - tp.backward_s, pass, 1e-12);
}
