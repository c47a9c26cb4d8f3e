// LoRA on the model (model/lora.h): which linears PEFT's rules adapt, and in float64 that the
// adapted forward equals the merged weights' forward, that only the adapters get gradients, and
// that those gradients are the chain rule through the merged weight (dA = s B^T G, dB = s G A^T).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>

#include "model/llama.h"
#include "model/lora.h"
#include "model/quant/quantized_base.h"
#include "util/error.h"

using namespace shardlm;

namespace {

model::LlamaConfig tiny() {
  auto cfg = model::preset("tiny");
  cfg.num_hidden_layers = 2;
  return cfg;
}

std::string error_of(const model::LoraOptions& o, const model::LlamaConfig& cfg) {
  try {
    model::resolve_lora(o, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const double d = (a - b).abs().max().item<double>(), s = b.abs().max().item<double>();
  return std::isfinite(d) ? d / std::max(s, 1e-300) : INFINITY;
}

// B nonzero everywhere, so that the adapters change the logits.
void randomize_b(model::Llama& m) {
  at::NoGradGuard g;
  auto gen = at::detail::createCPUGenerator(11);
  for (auto& p : m.parameters())
    if (p.name.find("lora_B") != std::string::npos) p.tensor.normal_(0, 0.05, gen);
}

}  // namespace

TEST(Lora, TargetsFollowPeftRules) {
  const auto cfg = tiny();
  model::LoraOptions o;
  auto plan = model::resolve_lora(o, cfg);  // llama's default: q_proj, v_proj
  ASSERT_EQ(plan.targets.size(), 4u);
  EXPECT_EQ(plan.targets[0].module, "self_attn.q_proj");
  EXPECT_EQ(plan.targets[1].module, "self_attn.v_proj");
  EXPECT_DOUBLE_EQ(plan.targets[0].scaling, 1.0);
  o.target_regex = "all-linear";
  o.r = 4;
  o.lora_alpha = 16;
  o.use_rslora = true;
  o.rank_pattern = {{"down_proj", 2}};
  o.alpha_pattern = {{"model.layers.1.self_attn.o_proj", 3}};
  plan = model::resolve_lora(o, cfg);
  ASSERT_EQ(plan.targets.size(), 14u);
  EXPECT_DOUBLE_EQ(plan.targets[0].scaling, 16 / 2.0);   // rslora: alpha / sqrt(4)
  EXPECT_EQ(plan.targets[6].r, 2);                         // layer 0's down_proj
  EXPECT_DOUBLE_EQ(plan.targets[10].alpha, 3);             // layer 1's o_proj
  o = {};
  o.target_regex = "model\\.layers\\.1\\.mlp\\.(up|down)_proj";  // a full match, as re.fullmatch
  plan = model::resolve_lora(o, cfg);
  ASSERT_EQ(plan.targets.size(), 2u);
  EXPECT_EQ(plan.targets[1].module, "mlp.down_proj");
  o = {};
  o.target_regex = "up_proj";  // no module's full name is "up_proj"
  EXPECT_NE(error_of(o, cfg).find("lora.target_modules"), std::string::npos);
  o = {};
  o.target_modules = {"k_proj", "gate"};
  o.layers_to_transform = {1};
  EXPECT_NE(error_of(o, cfg).find("\"gate\" matches no linear module"), std::string::npos) << error_of(o, cfg);
  o.target_modules = {"k_proj"};
  plan = model::resolve_lora(o, cfg);
  ASSERT_EQ(plan.targets.size(), 1u);
  EXPECT_EQ(plan.targets[0].layer, 1);
  o.r = 0;
  EXPECT_NE(error_of(o, cfg).find("lora.r must be > 0"), std::string::npos);
}

TEST(Lora, AdaptedForwardEqualsMergedWeightsAndOnlyAdaptersLearn) {
  const auto cfg = tiny();
  model::Llama lora(cfg, 3, at::kDouble);
  model::LoraOptions o;
  o.target_regex = "all-linear";
  o.r = 4;
  o.lora_alpha = 8;
  lora.apply_lora(model::resolve_lora(o, cfg), 7);
  ASSERT_EQ(lora.parameters().size(), 28u);  // 2 layers x 7 linears x (A, B)
  EXPECT_EQ(lora.parameters()[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(lora.units()[0].params.size(), 0u);  // the embedding is frozen
  EXPECT_EQ(lora.units()[1].params.size(), 14u);
  randomize_b(lora);
  model::Llama merged(cfg, 99, at::kDouble);
  merged.load(lora.merged_tensors(), "merged");
  auto gen = at::detail::createCPUGenerator(5);
  const auto ids = at::randint(cfg.vocab_size, {2, 16}, gen, at::kLong);
  const auto base_logits = model::Llama(cfg, 3, at::kDouble).forward(ids);
  const auto logits = lora.forward(ids), want = merged.forward(ids);
  EXPECT_LT(max_rel(logits, want), 1e-12);
  EXPECT_GT(max_rel(logits, base_logits), 1e-3);  // the adapters matter
  model::cross_entropy_loss(logits, ids).backward();
  model::cross_entropy_loss(want, ids).backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& p : merged.parameters()) g[p.name] = p.tensor.grad();
  for (size_t i = 0; i < lora.parameters().size(); i += 2) {
    const auto& a = lora.parameters()[i];
    const auto& b = lora.parameters()[i + 1];
    const auto w = a.name.substr(0, a.name.size() - std::string(".lora_A.weight").size()) + ".weight";
    const double s = 2.0;  // alpha / r
    EXPECT_LT(max_rel(a.tensor.grad(), s * b.tensor.detach().t().matmul(g[w])), 1e-10) << a.name;
    EXPECT_LT(max_rel(b.tensor.grad(), s * g[w].matmul(a.tensor.detach().t())), 1e-10) << b.name;
  }
  for (size_t k = 0; k < lora.frozen_base()->size(); ++k)
    EXPECT_FALSE(lora.frozen_base()->weight(k).grad().defined()) << lora.frozen_base()->name(k);
}

TEST(Lora, KaimingUniformAAndZeroB) {
  at::Tensor a = at::empty({8, 64}, at::kDouble), b = at::empty({32, 8}, at::kDouble);
  auto gen = at::detail::createCPUGenerator(1);
  model::init_lora_pair(a, b, "true", gen);
  EXPECT_LE(a.abs().max().item<double>(), 1.0 / 8);  // U(-1/sqrt(64), 1/sqrt(64))
  EXPECT_GT(a.abs().max().item<double>(), 0.9 / 8);
  EXPECT_EQ(b.abs().max().item<double>(), 0.0);
  model::init_lora_pair(a, b, "gaussian", gen);
  EXPECT_NEAR(a.std().item<double>(), 1.0 / 8, 0.02);  // std 1 / r
  EXPECT_THROW(model::init_lora_pair(a, b, "pissa", gen), Error);
}

// lora_dropout > 0 under full activation checkpointing: the forward draws the dropout mask with
// autograd off and the replay in backward restores the generator first (torch.utils.checkpoint's
// preserve_rng_state), so loss and every adapter gradient equal the run without recomputation
// exactly. Before, the autograd-off forward dropped nothing and the replay drew another mask.
TEST(Lora, DropoutUnderFullRecomputationDrawsTheSameMask) {
  const auto cfg = tiny();
  model::LoraOptions o;
  o.target_regex = "all-linear";
  o.r = 4;
  o.lora_dropout = 0.25;
  auto gen = at::detail::createCPUGenerator(5);
  const auto ids = at::randint(cfg.vocab_size, {2, 16}, gen, at::kLong);
  auto run = [&](model::Recompute r, std::vector<at::Tensor>* grads) {
    model::Llama m(cfg, 3, at::kDouble);
    m.apply_lora(model::resolve_lora(o, cfg), 7);
    randomize_b(m);
    m.set_recompute(r);
    at::manual_seed(42);
    const auto loss = model::cross_entropy_loss(m.forward(ids), ids);
    loss.backward();
    for (const auto& p : m.parameters()) grads->push_back(p.tensor.grad());
    return loss.item<double>();
  };
  std::vector<at::Tensor> kept, replayed, undropped;
  const double want = run(model::Recompute::None, &kept);
  EXPECT_EQ(run(model::Recompute::Full, &replayed), want);
  ASSERT_EQ(kept.size(), replayed.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(at::equal(kept[i], replayed[i])) << i;
  o.lora_dropout = 0;  // the dropout is drawn at all: another loss without it
  EXPECT_GT(std::abs(run(model::Recompute::None, &undropped) - want), 1e-6);
}

// A pipeline stage keeps only its units' frozen base (plain or 4-bit): the others' tensors are freed,
// and the stage's own forward still runs.
TEST(Lora, AStageReleasesTheOtherUnitsFrozenBase) {
  const auto cfg = tiny();
  model::LoraOptions o;
  o.target_regex = "all-linear";
  for (bool four_bit : {false, true}) {
    model::Llama m(cfg, 3, at::kFloat);
    m.apply_lora(model::resolve_lora(o, cfg), 7);
    if (four_bit) m.set_frozen_base(model::quant::quantize_frozen_base(*m.frozen_base(), {}));
    const int64_t whole = m.frozen_base()->bytes();
    m.release_frozen_units({true, true, false, false});  // the embedding and layer 0 of 2
    EXPECT_LT(m.frozen_base()->bytes() * 10, whole * 6) << four_bit;  // about half: one layer of two, no head
    const auto& base = *m.frozen_base();
    for (size_t k = 0; k < base.size(); ++k) {
      const bool other = base.name(k).rfind("model.layers.1.", 0) == 0 || base.name(k) == "lm_head.weight" ||
                         base.name(k) == "model.norm.weight";
      EXPECT_EQ(base.weight(k).numel() == 0, other) << base.name(k) << " four_bit " << four_bit;
    }
    auto gen = at::detail::createCPUGenerator(5);
    const auto ids = at::randint(cfg.vocab_size, {1, 8}, gen, at::kLong);
    EXPECT_EQ(m.forward_units(ids, 0, 1, 8).sizes(), (std::vector<int64_t>{1, 8, cfg.hidden_size}));
  }
}
