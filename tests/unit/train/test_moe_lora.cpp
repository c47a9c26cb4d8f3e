// LoRA on the experts' 3-D weights (lora.target_parameters, PEFT's lora.ParamWrapper; model/lora.h)
// against PEFT: the goldens tests/golden/lora_mixtral/ and lora_qwen2_moe/ (make_lora_golden.py
// --case mixtral|qwen2_moe) run through test_lora.cpp's trajectory (logits, the 3 AdamW steps' losses,
// the adapters after them: fp32 <= 1e-5 relative). Then the project's own float64 checks (the merged
// experts are W_e + scaling * B_e A_e with PEFT's layout, and give the adapted model's logits), the
// adapter_config.json written on export read back to the same adapters, and what PEFT refuses.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "io/hf_weights.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "train/lora_config.h"
#include "util/error.h"
#include "config_files.h"

using namespace shardlm;

// test_lora.cpp: one run of a golden's 3 AdamW steps against PEFT's values.
void expect_peft_trajectory(at::ScalarType dtype, double bound, const std::string& golden, size_t parameters);

namespace {

const std::string kMixtralGolden = std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/lora_mixtral";
const std::string kQwen2MoeGolden = std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/lora_qwen2_moe";

std::unique_ptr<model::Llama> moe_lora_model(const std::string& golden, at::ScalarType dtype) {
  auto m = std::make_unique<model::Llama>(model::read_hf_config(golden + "/base/config.json"), 0, dtype);
  m->load(io::load_hf_weights(golden + "/base"), "golden base");
  train::LoraConfig lc;
  lc.enabled = true;
  lc.init_from = golden + "/adapter_init";
  train::apply_lora(*m, lc, 0);
  return m;
}

std::string moe_lora_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double moe_lora_rel(const at::Tensor& a, const at::Tensor& b) {
  const double d = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  return std::isfinite(d) ? d / std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-300) : INFINITY;
}

}  // namespace

// Mixtral: q_proj's adapters beside both expert weights (nested wrappers: gate_up_proj's adapters under
// mlp.experts.base_layer), rank_pattern and alpha_pattern on the expert weights. 2 layers x (q_proj,
// gate_up_proj, down_proj) x (A, B) = 12 tensors.
TEST(MoeLoraParity, MixtralExpertAdaptersFollowPeftForThreeAdamWSteps) {
  expect_peft_trajectory(at::kFloat, 1e-5, kMixtralGolden, 12);
}
// float64 comes no closer to PEFT than fp32 here: transformers computes RMSNorm, RoPE and the router's
// softmax in float32 even in a float64 model (the float64 exactness is MergedExperts... below).
TEST(MoeLoraParity, MixtralExpertAdaptersInFloat64WithinTransformersFloat32Parts) {
  expect_peft_trajectory(at::kDouble, 1e-5, kMixtralGolden, 12);
}
// Qwen2-MoE with its shared expert: gate_up_proj only (one wrapper: mlp.experts.lora_A), no
// target_modules (no linear adapted), use_rslora.
TEST(MoeLoraParity, Qwen2MoeGateUpAdaptersFollowPeftForThreeAdamWSteps) {
  expect_peft_trajectory(at::kFloat, 1e-5, kQwen2MoeGolden, 4);
}

// export --merge: each expert's weight is W_e + scaling * B_e A_e with PEFT's layout (A_e = rows
// e*r.. of lora_A, B_e = columns j*E + e of lora_B), and the merged model without adapters computes the
// adapted model's logits (float64, <= 1e-10).
TEST(MoeLora, MergedExpertsAreWPlusScaledBAPerExpertAndGiveTheSameLogits) {
  auto m = moe_lora_model(kMixtralGolden, at::kDouble);
  std::map<std::string, at::Tensor> base, merged, adapters;
  for (auto& [n, t] : io::load_hf_weights(kMixtralGolden + "/base")) base[n] = t.to(at::kDouble);
  for (auto& [n, t] : m->merged_tensors()) merged[n] = t;
  for (auto& [n, t] : m->named_tensors()) adapters[n] = t;
  // Layer 1's down_proj: [E, H, I], r 3 (rank_pattern), alpha 4: scaling 4/3.
  const auto a = adapters.at("model.layers.1.mlp.experts.lora_A.weight");
  const auto b = adapters.at("model.layers.1.mlp.experts.lora_B.weight");
  const int64_t E = 4, r = 3;
  ASSERT_EQ(a.size(0), r * E);
  ASSERT_EQ(b.size(1), r * E);
  for (int64_t e = 0; e < E; ++e) {
    const auto w = base.at("model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".w2.weight");
    const auto expect = w + at::matmul(b.slice(1, e, r * E, E), a.narrow(0, e * r, r)) * (4.0 / 3.0);
    const double err = moe_lora_rel(merged.at("model.layers.1.mlp.experts.down_proj").select(0, e), expect);
    EXPECT_LE(err, 1e-12) << "expert " << e;
  }
  model::Llama plain(m->config(), 0, at::kDouble);
  plain.load(m->merged_tensors(), "merged");
  const auto ids = at::randint(0, 32, {2, 8}, at::TensorOptions().dtype(at::kLong));
  at::NoGradGuard g;
  const double err = moe_lora_rel(plain.forward(ids), m->forward(ids));
  std::printf("[ moe lora fp64] merged export vs adapted model: logits %.3g\n", err);
  EXPECT_LE(err, 1e-10);
  EXPECT_GT((plain.forward(ids) - model::Llama(m->config(), 0, at::kDouble).forward(ids)).abs().max().item<double>(), 0);
}

// The adapter_config.json export writes (target_parameters by full names, patterns by full names) reads
// back to the same adapters: names, ranks, scalings and where PEFT keeps them.
TEST(MoeLora, ExportedAdapterConfigReadsBackToTheSameExpertAdapters) {
  auto m = moe_lora_model(kMixtralGolden, at::kFloat);
  const auto j = train::peft_adapter_config(*m, "");
  EXPECT_EQ(j["target_parameters"].size(), 4u) << j.dump();
  EXPECT_EQ(j["target_modules"].size(), 2u) << j.dump();
  train::LoraConfig read;
  train::read_peft_adapter_config(j, "adapter_config.json", read);
  const auto again = model::resolve_lora(read.peft, m->config());
  const auto& first = m->lora_plan().targets;
  ASSERT_EQ(again.targets.size(), first.size());
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_EQ(model::lora_adapter_prefix(again.targets[k]), model::lora_adapter_prefix(first[k]));
    EXPECT_EQ(again.targets[k].r, first[k].r);
    EXPECT_DOUBLE_EQ(again.targets[k].scaling, first[k].scaling);
    EXPECT_EQ(again.targets[k].experts, first[k].experts);
  }
}

// PEFT's refusals (ParamWrapper and dropout) and what shardlm does not build, each naming the key.
TEST(MoeLora, RefusesDropoutUnmatchedNamesDenseModelsAndExpertParallelism) {
  const auto cfg = model::read_hf_config(kMixtralGolden + "/base/config.json");
  model::LoraOptions o;
  o.target_parameters = {"mlp.experts.gate_up_proj"};
  o.lora_dropout = 0.1;
  auto e = moe_lora_error([&] { model::resolve_lora(o, cfg); });
  EXPECT_NE(e.find("lora.target_parameters with lora.lora_dropout"), std::string::npos) << e;
  o.lora_dropout = 0;
  o.target_parameters = {"mlp.experts.up_proj"};
  e = moe_lora_error([&] { model::resolve_lora(o, cfg); });
  EXPECT_NE(e.find("lora.target_parameters: \"mlp.experts.up_proj\" matches no expert parameter"), std::string::npos) << e;
  o.target_parameters = {"gate_up_proj"};
  const auto dense = model::read_hf_config(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/lora/base/config.json");
  e = moe_lora_error([&] { model::resolve_lora(o, dense); });
  EXPECT_NE(e.find("a dense model has no 3-D expert weights"), std::string::npos) << e;
  // Without target_modules only the experts are adapted (PEFT sets target_modules to an empty set).
  const auto plan = model::resolve_lora(o, cfg);
  ASSERT_EQ(plan.targets.size(), 2u);
  EXPECT_EQ(model::lora_adapter_prefix(plan.targets[0]), "model.layers.0.mlp.experts");
  using train::testing::kBase;
  e = train::testing::error_of(kBase, {"lora.enabled=true", "lora.target_parameters=[\"gate_up_proj\"]",
                                       "parallelism.expert_parallel=2"});
  EXPECT_NE(e.find("lora.enabled with parallelism.expert_parallel 2 is not built yet"), std::string::npos) << e;
}

// float64 gradients: the expert adapters' are the chain rule through the weight the experts compute
// with, W'_e = W_e + s B_e A_e: with G_e = dL/dW'_e (a model holding the merged weights as parameters),
// dA_e = s B_e^T G_e and dB_e = s G_e A_e^T (<= 1e-10), in PEFT's layout.
TEST(MoeLora, ExpertAdapterGradientsAreTheChainRuleThroughTheMergedWeight) {
  auto m = moe_lora_model(kMixtralGolden, at::kDouble);
  model::Llama plain(m->config(), 0, at::kDouble);
  plain.load(m->merged_tensors(), "merged");
  const auto ids = at::randint(0, 32, {2, 9}, at::TensorOptions().dtype(at::kLong));
  const auto in = ids.narrow(1, 0, 8).contiguous(), tg = ids.narrow(1, 1, 8).contiguous();
  model::cross_entropy_loss(m->forward(in), tg).backward();
  model::cross_entropy_loss(plain.forward(in), tg).backward();
  std::map<std::string, at::Tensor> adapted, merged;
  for (auto& p : m->parameters()) adapted[p.name] = p.tensor;
  for (auto& p : plain.parameters()) merged[p.name] = p.tensor;
  // Layer 1's down_proj (r 3, alpha 4) and gate_up_proj (r 2, alpha 6: alpha_pattern).
  struct Case {
    const char* weight;
    const char* prefix;
    int64_t r;
    double s;
  };
  const int64_t E = 4;
  for (const auto& c : {Case{"down_proj", "model.layers.1.mlp.experts.", 3, 4.0 / 3.0},
                        Case{"gate_up_proj", "model.layers.1.mlp.experts.base_layer.", 2, 3.0}}) {
    const auto G = merged.at(std::string("model.layers.1.mlp.experts.") + c.weight).grad();
    const auto& a = adapted.at(std::string(c.prefix) + "lora_A.weight");
    const auto& b = adapted.at(std::string(c.prefix) + "lora_B.weight");
    ASSERT_TRUE(G.defined() && a.grad().defined() && b.grad().defined()) << c.weight;
    double worst = 0;
    for (int64_t e = 0; e < E; ++e) {
      const auto a_e = a.detach().narrow(0, e * c.r, c.r), b_e = b.detach().slice(1, e, c.r * E, E);
      const auto da = at::matmul(b_e.t(), G.select(0, e)) * c.s, db = at::matmul(G.select(0, e), a_e.t()) * c.s;
      worst = std::max({worst, moe_lora_rel(a.grad().narrow(0, e * c.r, c.r), da),
                        moe_lora_rel(b.grad().slice(1, e, c.r * E, E), db)});
    }
    std::printf("[ moe lora fp64] %s: adapter gradients vs the chain rule %.3g\n", c.weight, worst);
    EXPECT_LE(worst, 1e-10) << c.weight;
  }
}

// bf16 experts: the weight W + s B A is formed by one baddbmm in bf16 (as PEFT's _LoraFactorsProxy);
// the logits stay within bf16's rounding of the fp32 model's and every adapter gets a gradient.
TEST(MoeLora, Bf16ExpertAdaptersComputeNearFp32AndTrain) {
  auto m16 = moe_lora_model(kMixtralGolden, at::kBFloat16);
  auto m32 = moe_lora_model(kMixtralGolden, at::kFloat);
  const auto ids = at::randint(0, 32, {2, 9}, at::TensorOptions().dtype(at::kLong));
  const auto in = ids.narrow(1, 0, 8).contiguous(), tg = ids.narrow(1, 1, 8).contiguous();
  const auto logits = m16->forward(in);
  EXPECT_EQ(m16->parameters().at(2).tensor.scalar_type(), at::kBFloat16);  // the model computes in bf16
  const double err = moe_lora_rel(logits, m32->forward(in).detach());
  std::printf("[ moe lora bf16] logits vs fp32: %.3g\n", err);
  EXPECT_LE(err, 5e-2);
  model::cross_entropy_loss(logits, tg).backward();
  for (const auto& p : m16->parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_TRUE(at::isfinite(p.tensor.grad()).all().item<bool>()) << p.name;
    EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0) << p.name;
  }
}
