// Numerical parity with Hugging Face LlamaForCausalLM: logits, loss and every parameter gradient
// of the tiny model (GQA; untied and tied head) against golden values computed by
// tests/reference/make_golden.py (PyTorch, checked against transformers' LlamaForCausalLM) on the same
// safetensors weights.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "io/safetensors.h"
#include "model/llama.h"
#include "../../support/worst_of.h"

using namespace shardlm;

namespace {

std::map<std::string, at::Tensor> as_map(const io::NamedTensors& v) {
  std::map<std::string, at::Tensor> m;
  for (const auto& [k, t] : v) m[k] = t;
  return m;
}

// Relative error in the norm sense plus an elementwise bound scaled by the tensor's magnitude:
// near-zero entries make a purely elementwise relative check meaningless even between f32 and f64.
// Returns the norm-wise relative error (also printed for logits and loss).
double expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tol = 1e-5) {
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  if (got.sizes() != want.sizes()) return 1;
  const auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = w.abs().max().item<double>();
  const double rel_norm = (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
  const double worst = ((g - w).abs() - tol * w.abs()).max().item<double>() / std::max(scale, 1e-30);
  EXPECT_LE(rel_norm, tol) << what << ": norm-wise relative error";
  if (what.find("grad of") == std::string::npos)
    std::printf("[ parity   ] %s: norm-wise relative error %.2e\n", what.c_str(), rel_norm);
  EXPECT_LE(worst, tol) << what << ": elementwise error beyond tol*|ref|, relative to max|ref|";
  return rel_norm;
}

void check_parity(const std::string& dir) {
  const std::string root = std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/" + dir;
  const auto cfg = model::read_hf_config(root + "/config.json");
  model::Llama llama(cfg, /*seed=*/999);  // weights then replaced by the golden ones
  llama.load(io::load_safetensors(root + "/model.safetensors"), root + "/model.safetensors");
  auto golden = as_map(io::load_safetensors(root + "/parity.safetensors"));

  const auto logits = llama.forward(golden.at("input_ids"));
  expect_close(logits, golden.at("logits"), dir + " logits");
  const auto loss = model::cross_entropy_loss(logits, golden.at("targets"));
  expect_close(loss, golden.at("loss"), dir + " loss");
  loss.backward();
  int checked = 0;
  double worst = 0;
  for (const auto& p : llama.parameters()) {
    ASSERT_TRUE(golden.count("grad." + p.name)) << "no golden gradient for " << p.name;
    worst = test_support::worst_of(worst, expect_close(p.tensor.grad(), golden.at("grad." + p.name), dir + " grad of " + p.name));
    ++checked;
  }
  std::printf("[ parity   ] %s: %d gradients, worst norm-wise relative error %.2e\n", dir.c_str(), checked, worst);
  EXPECT_EQ(checked, static_cast<int>(llama.parameters().size()));
}

}  // namespace

TEST(LlamaParity, TinyUntiedMatchesHuggingFace) { check_parity("tiny"); }
TEST(LlamaParity, TinyTiedMatchesHuggingFace) { check_parity("tiny_tied"); }

TEST(LlamaParity, ParameterNamesAndOrderAreHuggingFaces) {
  model::Llama llama(model::preset("tiny"), 0);
  const auto& p = llama.parameters();
  ASSERT_EQ(p.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(p[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(p[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(p[2].tensor.sizes(), (at::IntArrayRef{32, 64}));  // 2 kv heads x head_dim 16
  EXPECT_EQ(p[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(p[19].name, "model.norm.weight");
  EXPECT_EQ(p[20].name, "lm_head.weight");
  EXPECT_EQ(llama.num_parameters(), model::preset("tiny").num_parameters());
  ASSERT_EQ(llama.units().size(), 4u);  // embed, 2 layers, head
  EXPECT_EQ(llama.units()[3].params.size(), 2u);
}

TEST(LlamaParity, LoadRefusesMismatchedWeightsNamingTheTensor) {
  auto cfg = model::preset("tiny");
  cfg.intermediate_size = 128;  // golden weights have 176
  model::Llama llama(cfg, 0);
  const std::string path = std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/tiny/model.safetensors";
  try {
    llama.load(io::load_safetensors(path), path);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[176, 64]"), std::string::npos) << msg;
  }
}

TEST(LlamaConfig, PresetsHaveTheRealShapes) {
  EXPECT_NEAR(model::preset("llama-7b").num_parameters() / 1e9, 6.74, 0.01);
  EXPECT_NEAR(model::preset("llama-13b").num_parameters() / 1e9, 13.02, 0.01);
  EXPECT_NEAR(model::preset("llama-70b").num_parameters() / 1e9, 68.98, 0.01);
  const double demo = model::preset("demo").num_parameters() / 1e6;
  EXPECT_GT(demo, 10);
  EXPECT_LT(demo, 30);
  EXPECT_THROW(model::preset("llama-8b"), std::exception);
}
