// DeepSpeed's optimizer types and LR schedulers (issue 24) against golden values made by
// tests/reference/make_deepspeed_goldens.py: Adam with adam_w_mode=false against torch.optim.Adam,
// bias_correction=false and Lamb against DeepSpeed's kernel arithmetic transcribed in float64
// (tests/golden/deepspeed_optim.json), and every scheduler against the pinned DeepSpeed 0.19.8's own
// classes stepped as its engine steps them (tests/golden/deepspeed_lr.json).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/adamw.h"
#include "optim/lr_schedule.h"

using namespace shardlm;
using json = nlohmann::json;

namespace {

json golden(const std::string& name) {
  std::ifstream in(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/" + name);
  EXPECT_TRUE(in.good()) << name;
  return json::parse(in);
}

at::Tensor tensor(const json& values, at::IntArrayRef shape) {
  const auto v = values.get<std::vector<double>>();
  return at::tensor(v, at::kDouble).reshape(shape).clone();
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

TEST(DeepSpeedOptimizers, AdamL2AndNoBiasCorrectionAndLambMatchTheirReferencesInFloat64) {
  const json g = golden("deepspeed_optim.json");
  ASSERT_EQ(g["cases"].size(), 6u);
  int lamb_clamped_at_max = 0, lamb_norm_zero = 0;
  for (const auto& c : g["cases"]) {
    const std::string name = c["name"];
    const auto& o = c["options"];
    optim::AdamWOptions opt{o["lr"], o["betas"][0], o["betas"][1], o["eps"], o["weight_decay"]};
    const std::string rule = o["rule"];
    opt.rule = rule == "Lamb" ? optim::UpdateRule::Lamb : rule == "AdamL2" ? optim::UpdateRule::AdamL2
                                                                            : optim::UpdateRule::AdamW;
    opt.bias_correction = o["bias_correction"];
    if (rule == "Lamb") opt.max_coeff = o["max_coeff"], opt.min_coeff = o["min_coeff"], opt.eps_inside_sqrt = o["eps_inside_sqrt"];
    auto w = tensor(c["init"]["w"], {4, 3}), b = tensor(c["init"]["b"], {3});
    auto gw = at::zeros_like(w), gb = at::zeros_like(b);
    optim::AdamW adam({{"w", w, gw, true}, {"b", b, gb, false}}, opt);
    for (size_t k = 0; k < c["grads"].size(); ++k) {
      gw.copy_(tensor(c["grads"][k]["w"], {4, 3}));
      gb.copy_(tensor(c["grads"][k]["b"], {3}));
      adam.step(o["lr"].get<double>());
      EXPECT_LE(max_rel_diff(w, tensor(c["after"][k]["w"], {4, 3})), 1e-12) << name << " w after step " << k + 1;
      EXPECT_LE(max_rel_diff(b, tensor(c["after"][k]["b"], {3})), 1e-12) << name << " b after step " << k + 1;
      if (rule == "Lamb") {
        const auto expected = c["lamb_coeffs"][k].get<std::vector<double>>();
        ASSERT_EQ(adam.lamb_coeffs().size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_NEAR(adam.lamb_coeffs()[i], expected[i], 1e-12 * expected[i]) << name << " step " << k + 1;
          lamb_clamped_at_max += expected[i] == opt.max_coeff;
          lamb_norm_zero += k == 0 && i == 1 && expected[i] == 1.0;  // b starts at 0: ||p|| = 0, ratio 1
        }
      }
    }
  }
  EXPECT_GE(lamb_clamped_at_max, 1);  // the goldens exercise the clamp...
  EXPECT_GE(lamb_norm_zero, 1);       // ...and the zero-norm rule
}

TEST(DeepSpeedOptimizers, AdamWithAdamWModeIsAdamWAndLambIsNot) {
  // The same gradients through AdamW, Adam in L2 mode and Lamb give three different updates:
  // Adam's adam_w_mode=false is not AdamW, and Lamb never runs as AdamW.
  std::vector<at::Tensor> after;
  for (auto rule : {optim::UpdateRule::AdamW, optim::UpdateRule::AdamL2, optim::UpdateRule::Lamb}) {
    auto p = at::linspace(-1.0, 1.0, 12, at::kDouble).reshape({4, 3}), g = at::full({4, 3}, 0.5, at::kDouble);
    optim::AdamWOptions o{1e-2, 0.9, 0.999, 1e-8, 0.1};
    o.rule = rule;
    optim::AdamW opt({{"p", p, g, true}}, o);
    opt.step(1e-2);
    after.push_back(p);
  }
  EXPECT_GT((after[0] - after[1]).abs().max().item<double>(), 1e-6);
  EXPECT_GT((after[0] - after[2]).abs().max().item<double>(), 1e-6);
}

TEST(DeepSpeedSchedulers, EveryStepsLrIsDeepSpeeds) {
  const json g = golden("deepspeed_lr.json");
  EXPECT_EQ(g["deepspeed"], "0.19.8");
  ASSERT_EQ(g["cases"].size(), 8u);
  for (const auto& c : g["cases"]) {
    const auto& p = c["params"];
    optim::LrSchedule s;
    s.params.type = c["type"];
    s.base_lr = c["optimizer_lr"];
    s.params.warmup_num_steps = p.value("warmup_num_steps", 1000);
    s.params.warmup_type = p.value("warmup_type", std::string("log"));
    s.params.warmup_min_lr = p.value("warmup_min_lr", 0.0);
    s.params.warmup_max_lr = p.value("warmup_max_lr", 1e-3);
    s.params.warmup_min_ratio = p.value("warmup_min_ratio", 0.0);
    s.params.cos_min_ratio = p.value("cos_min_ratio", 1e-4);
    s.params.total_num_steps = p.value("total_num_steps", 1);
    const auto lrs = c["lr_per_step"].get<std::vector<double>>();
    for (size_t k = 0; k < lrs.size(); ++k)
      EXPECT_NEAR(s.lr_at(static_cast<int64_t>(k)), lrs[k], 1e-15 * std::max(1e-3, lrs[k]))
          << s.params.type << " " << p.dump() << " step " << k;
  }
}
