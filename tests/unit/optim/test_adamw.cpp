// AdamW and gradient clipping against torch.optim.AdamW / torch.nn.utils.clip_grad_norm_ golden
// values (tests/golden/adamw.safetensors, made by tests/reference/make_golden.py), and the LR schedule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

using namespace shardlm;

TEST(AdamW, MatchesTorchAdamWWithClippingOverSixSteps) {
  std::map<std::string, at::Tensor> g;
  for (auto& [k, t] : io::load_safetensors(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/adamw.safetensors"))
    g[k] = t;
  auto w = g.at("init.w").clone(), b = g.at("init.b").clone();
  auto gw = at::zeros_like(w), gb = at::zeros_like(b);
  optim::AdamW opt({{"w", w, gw, true}, {"b", b, gb, false}}, {0.0, 0.9, 0.95, 1e-8, 0.1});
  int clipped_steps = 0;
  for (int k = 0; k < 6; ++k) {
    gw.copy_(g.at("grad." + std::to_string(k) + ".w"));
    gb.copy_(g.at("grad." + std::to_string(k) + ".b"));
    const double norm = std::sqrt(optim::local_grad_sum_of_squares({gw, gb}));
    EXPECT_NEAR(norm, g.at("total_norm")[k].item<double>(), 1e-5 * norm) << "step " << k;
    clipped_steps += norm > 1.0;
    optim::clip_grads({gw, gb}, norm, 1.0);
    opt.step(1e-2 * (k + 1) / 6.0);
    const auto ew = g.at("after." + std::to_string(k) + ".w"), eb = g.at("after." + std::to_string(k) + ".b");
    EXPECT_LE((w - ew).abs().max().item<double>(), 1e-6 * ew.abs().max().item<double>()) << "w after step " << k;
    EXPECT_LE((b - eb).abs().max().item<double>(), 1e-6 * eb.abs().max().item<double>()) << "b after step " << k;
  }
  EXPECT_GE(clipped_steps, 1);  // the golden sequence exercises clipping...
  EXPECT_LT(clipped_steps, 6);  // ...and steps without it
  EXPECT_EQ(opt.steps_taken(), 6);
}

TEST(AdamW, WeightDecayOnlyWhereAsked) {
  auto p = at::ones({2}), g = at::zeros({2});
  auto q = at::ones({2}), h = at::zeros({2});
  optim::AdamW opt({{"p", p, g, true}, {"q", q, h, false}}, {0.1, 0.9, 0.95, 1e-8, 0.5});
  opt.step(0.1);
  EXPECT_NEAR(p[0].item<double>(), 1.0 - 0.1 * 0.5, 1e-7);  // zero grad: only decay moves it
  EXPECT_DOUBLE_EQ(q[0].item<double>(), 1.0);
}

TEST(Clipping, NoOpBelowMaxNormAndExactAbove) {
  auto g = at::full({4}, 3.0);  // norm 6
  optim::clip_grads({g}, 6.0, 0.0);
  EXPECT_DOUBLE_EQ(g[0].item<double>(), 3.0);  // 0 disables clipping
  optim::clip_grads({g}, 6.0, 100.0);
  EXPECT_DOUBLE_EQ(g[0].item<double>(), 3.0);
  optim::clip_grads({g}, 6.0, 3.0);
  EXPECT_NEAR(g[0].item<double>(), 3.0 * 3.0 / (6.0 + 1e-6), 1e-6);
}

TEST(LrSchedule, ConstantAndDeepSpeedsWarmupCosine) {
  optim::LrSchedule c{{"constant"}, 1e-3};
  EXPECT_DOUBLE_EQ(c.lr_at(0), 1e-3);
  EXPECT_DOUBLE_EQ(c.lr_at(1000), 1e-3);
  // DeepSpeed's WarmupCosineLR, linear warm-up: step s runs at iteration s - 1 (test_deepspeed_optim.cpp
  // compares every scheduler with DeepSpeed's own classes).
  optim::LrSchedule s{{"WarmupCosineLR", 10, 0.0, 0.1, 110}, 1.0};
  s.params.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);   // iteration -1: DeepSpeed's get_lr gives 0
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0);   // 0 / 10
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.9);  // 9 / 10, the warm-up's last step
  EXPECT_NEAR(s.lr_at(11), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 100)), 1e-15);  // cosine's first step: 1 of 100
  EXPECT_NEAR(s.lr_at(60), 0.1 + 0.9 * 0.5, 1e-12);  // half way
  EXPECT_NEAR(s.lr_at(111), 0.1, 1e-12);             // floor
}
