// Every Llama-family feature against transformers itself: for each case that
// tests/reference/make_family_cases.py builds with the pinned transformers (a rope type, head_dim,
// biases, a Mistral or Qwen2 window, tied and untied, a 128k vocabulary, Mixtral and Qwen2-MoE
// sparse experts with and without the load-balancing loss, per-expert and fused expert files),
// shardlm reads the case's config.json and model.safetensors as saved by transformers and must give
// transformers' float32 logits, loss (with router_aux_loss_coef x the load-balancing loss when
// output_router_logits is set, and that aux loss itself) and every gradient (norm-wise relative error <= 1e-5, the bound of the existing
// goldens), and in float64 the project's own float64 reference (hf_llama.py) to <= 1e-10.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/llama.h"

using namespace shardlm;

namespace {

const std::string kCases = SHARDLM_FAMILY_CASES_DIR;

std::vector<std::string> case_names() {
  std::ifstream in(kCases + "/cases.json");
  if (!in) return {};
  nlohmann::json j;
  in >> j;
  std::vector<std::string> out;
  for (const auto& c : j) out.push_back(c.at("name").get<std::string>());
  return out;
}

double rel_norm(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-300);
}

struct Worst {
  double value = 0;
  std::string what;
  void add(double v, const std::string& w) {
    if (v > value) value = v, what = w;
  }
};

// Forward, loss and backward of the case in `dtype`; each result against parity's `prefix` values.
Worst run_case(const std::string& name, at::ScalarType dtype, const std::string& prefix, double bound) {
  const std::string dir = kCases + "/" + name;
  const auto cfg = model::read_hf_config(dir + "/config.json");
  model::Llama llama(cfg, /*seed=*/7, dtype);
  llama.load(io::load_safetensors(dir + "/model.safetensors"), dir + "/model.safetensors");
  std::map<std::string, at::Tensor> golden;
  for (auto& [k, t] : io::load_safetensors(dir + "/parity.safetensors")) golden[k] = t;
  const auto logits = llama.forward(golden.at("input_ids"));
  const auto loss = llama.loss(logits, golden.at("targets"));  // + coef * aux loss (MoE, output_router_logits)
  loss.backward();
  Worst worst;
  auto check = [&](const at::Tensor& got, const std::string& key) {
    EXPECT_EQ(got.sizes(), golden.at(prefix + key).sizes()) << name << " " << key;
    const double e = rel_norm(got, golden.at(prefix + key));
    EXPECT_LE(e, bound) << name << " " << prefix << key;
    worst.add(e, key);
  };
  check(logits, "logits");
  check(loss, "loss");
  EXPECT_EQ(llama.router_aux_loss().defined(), golden.count(prefix + "aux_loss") > 0) << name;
  if (golden.count(prefix + "aux_loss") && llama.router_aux_loss().defined()) check(llama.router_aux_loss(), "aux_loss");
  for (const auto& p : llama.parameters()) {
    const bool present = golden.count(prefix + "grad." + p.name) > 0;
    EXPECT_TRUE(present) << name << ": no reference gradient for " << p.name;
    if (present) check(p.tensor.grad(), "grad." + p.name);
  }
  size_t grads = 0;  // every parameter transformers has, shardlm has
  for (const auto& [k, t] : golden) grads += k.rfind(prefix + "grad.", 0) == 0;
  EXPECT_EQ(grads, llama.parameters().size()) << name;
  return worst;
}

// One test per precision over every case (the cases exist only once ctest's fixture has run, so
// they cannot be listed as tests of their own when the binary is built).
void run_all(at::ScalarType dtype, const std::string& prefix, double bound, const char* against) {
  const auto names = case_names();
  // The fixture (ctest's reference_family_cases) wrote them; an empty list would test nothing.
  ASSERT_GE(names.size(), 15u) << "no cases in " << kCases << "; run tests/reference/make_family_cases.py";
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto w = run_case(name, dtype, prefix, bound);
    std::printf("[ family   ] %-24s %s: worst norm-wise relative error %.2e (%s)\n", name.c_str(), against, w.value,
                w.what.c_str());
  }
}

TEST(FamilyParity, Float32MatchesTransformers) { run_all(at::kFloat, "", 1e-5, "float32 vs transformers"); }

TEST(FamilyParity, Float64MatchesTheFloat64Reference) {
  run_all(at::kDouble, "f64.", 1e-10, "float64 vs hf_llama.py ");
}

}  // namespace
