// DeepSpeed's bf16 masters (bf16.bf16_master_weights_and_grads, read as optimizer.master_precision
// "bf16" with master_rounding "nearest") step as DeepSpeed's CPU Adam does: each of six steps starts
// from DeepSpeed's own state before it (tests/golden/deepspeed_cpu_adam.safetensors, a numpy float32
// transcript of deepspeed/ops/csrc/adam/cpu_adam_impl.cpp Step_1 written by
// tests/reference/make_deepspeed_cpu_adam_golden.py), and shardlm's AdamW must end where DeepSpeed's
// did to within one bf16 ulp of the step's scale (the larger of the result and the value before the
// step): bf16 weights and bf16 moments (bf16_optimizer_states), AdamW and Adam with L2 decay; with fp32
// moments the weights so, the moments to DeepSpeed's float constants (its 1 - beta2 is 0.99999 of
// shardlm's 0.001). Both compute the update in fp32 from the same values and round it once; the last
// fp32 bit differs (DeepSpeed's float 1 - beta, 1/sqrt(bc2) multiplied, decay as p + (-lr·wd)·p), which
// moves a bf16 result by one ulp where it lands by a rounding boundary, and by more of its own ulps only
// where it cancels (m·β1 against (1−β1)·g). Measured (AdamW, bf16 moments, 6 × 2504 elements): weights 5
// differ, exp_avg 151 (2 by more than their own ulp), exp_avg_sq 32, none by more than one ulp of the
// step's scale; the test prints these.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/master_format.h"
#include "../../support/worst_of.h"

using namespace shardlm;

namespace {

std::map<std::string, at::Tensor> cpu_adam_golden() {
  std::map<std::string, at::Tensor> g;
  for (auto& [k, t] : io::load_safetensors(std::string(SHARDLM_SOURCE_DIR) +
                                           "/tests/golden/deepspeed_cpu_adam.safetensors"))
    g[k] = t;
  return g;
}

const char* kCpuAdamNames[] = {"w", "b"};
const bool kCpuAdamDecay[] = {true, false};  // make_deepspeed_cpu_adam_golden.py SHAPES: b is in a group without decay
constexpr int kCpuAdamSteps = 6;

// bf16 values in the order of the reals: the distance in ulps is the difference of these.
at::Tensor ordered(const at::Tensor& bf16) {
  const auto bits = bf16.contiguous().view(at::kShort).to(at::kInt).bitwise_and(0xFFFF);
  return at::where(bits.ge(0x8000), 0x8000 - bits, bits);
}

// One bf16 ulp at the magnitude of x (2^(exponent - 7); the smallest normal's below it).
at::Tensor bf16_ulp(const at::Tensor& x) {
  const auto a = x.to(at::kDouble).abs().clamp_min(std::ldexp(1.0, -126));
  return at::exp2(at::floor(at::log2(a)) - 7);
}

struct Differences {
  int64_t elements = 0, differ = 0;
  int64_t max_ulps = 0;           // bf16: the largest distance in ulps of the result itself
  int64_t beyond_one_ulp = 0;     // bf16: results more than one of their own ulps apart
  double max_scaled_ulps = 0;     // the largest |difference| in bf16 ulps of the step's scale
  double max_relative = 0;        // fp32 moments: the largest |difference| / the step's scale
};

// One step of shardlm's AdamW from DeepSpeed's state before step t (its weights, moments and step
// count), with DeepSpeed's gradient t; the differences from DeepSpeed's state after it.
void step_from_deepspeeds_state(const std::map<std::string, at::Tensor>& g, const std::string& tag,
                                optim::UpdateRule rule, optim::StatePrecision moments, int t,
                                std::map<std::string, Differences>& diff) {
  const auto moment_dtype = moments == optim::StatePrecision::BF16 ? at::kBFloat16 : at::kFloat;
  std::map<std::string, at::Tensor> params, grads;
  std::vector<optim::Segment> segs;
  for (int k = 0; k < 2; ++k) {
    const std::string n = kCpuAdamNames[k];
    params[n] = (t == 1 ? g.at("init." + n) : g.at(tag + ".param." + std::to_string(t - 1) + "." + n)).clone();
    grads[n] = g.at("grad." + std::to_string(t) + "." + n).clone();  // bf16, as DeepSpeed's gradient partition
    segs.push_back({n, params[n], grads[n], kCpuAdamDecay[k]});
  }
  optim::AdamWOptions o{1e-2, 0.9, 0.999, 1e-8, 0.01};
  o.rule = rule;
  o.masters = optim::MasterRounding::Nearest;
  o.state_precision = moments;
  optim::AdamW adam(std::move(segs), o);
  for (int k = 0; k < 2; ++k) {
    const std::string n = kCpuAdamNames[k];
    ASSERT_EQ(adam.exp_avg(k).scalar_type(), moment_dtype);
    ASSERT_FALSE(adam.compensation(k).defined());  // nearest: no Kahan buffer, as DeepSpeed has none
    if (t > 1) {
      const std::string before = "." + std::to_string(t - 1) + "." + n;
      adam.adopt_state(k, at::Tensor(), g.at(tag + ".exp_avg" + before).clone(),
                       g.at(tag + ".exp_avg_sq" + before).clone(), at::Tensor(), at::Tensor());
    }
  }
  adam.set_steps_taken(t - 1);
  adam.step(1e-2);
  for (int k = 0; k < 2; ++k) {
    const std::string n = kCpuAdamNames[k], after = "." + std::to_string(t) + "." + n;
    const std::vector<std::pair<std::string, at::Tensor>> got = {
        {"param", params[n]}, {"exp_avg", adam.exp_avg(k)}, {"exp_avg_sq", adam.exp_avg_sq(k)}};
    for (const auto& [what, mine] : got) {
      const auto theirs = g.at(tag + "." + what + after);
      ASSERT_EQ(mine.scalar_type(), theirs.scalar_type()) << what;
      // The step's scale: the larger of DeepSpeed's result and the value before the step. Where a
      // result cancels (m·β1 against (1−β1)·g, a weight against its update) it is far below the terms
      // that made it, and their last-bit differences are many of its own ulps but not of theirs.
      const auto before = t == 1 ? (what == "param" ? g.at("init." + n) : at::zeros_like(theirs))
                                 : g.at(tag + "." + what + "." + std::to_string(t - 1) + "." + n);
      const auto scale = at::maximum(theirs.to(at::kDouble).abs(), before.to(at::kDouble).abs());
      const auto gap = (mine.to(at::kDouble) - theirs.to(at::kDouble)).abs();
      auto& d = diff[what];
      d.elements += mine.numel();
      d.differ += mine.ne(theirs).sum().item<int64_t>();
      d.max_scaled_ulps = test_support::worst_of(d.max_scaled_ulps, (gap / bf16_ulp(scale)).max().item<double>());
      if (mine.scalar_type() == at::kBFloat16) {
        const auto ulps = (ordered(mine) - ordered(theirs)).abs();
        d.max_ulps = std::max(d.max_ulps, ulps.max().item<int64_t>());
        d.beyond_one_ulp += ulps.gt(1).sum().item<int64_t>();
      } else {
        d.max_relative = test_support::worst_of(d.max_relative, (gap / scale.clamp_min(1e-30)).max().item<double>());
      }
    }
  }
}

std::map<std::string, Differences> run(const std::string& tag, optim::UpdateRule rule, optim::StatePrecision moments) {
  const auto g = cpu_adam_golden();
  std::map<std::string, Differences> diff;
  for (int t = 1; t <= kCpuAdamSteps; ++t) step_from_deepspeeds_state(g, tag, rule, moments, t, diff);
  for (const auto& [what, d] : diff)
    std::printf("[ deepspeed ] %s %s: %lld of %lld differ; max %.3g bf16 ulp of the step's scale; %s\n", tag.c_str(),
                what.c_str(), static_cast<long long>(d.differ), static_cast<long long>(d.elements), d.max_scaled_ulps,
                d.max_relative > 0 || d.max_ulps == 0
                    ? ("max relative " + std::to_string(d.max_relative)).c_str()
                    : ("max " + std::to_string(d.max_ulps) + " ulp of the result, " + std::to_string(d.beyond_one_ulp) +
                       " beyond 1 (cancelled results)").c_str());
  return diff;
}

}  // namespace

TEST(DeepSpeedCpuAdam, AdamWWithBf16MomentsIsDeepSpeedsWithinOneBf16Ulp) {
  const auto d = run("adamw.bf16", optim::UpdateRule::AdamW, optim::StatePrecision::BF16);
  for (const char* what : {"param", "exp_avg", "exp_avg_sq"}) {
    EXPECT_LE(d.at(what).max_scaled_ulps, 1.0) << what;
    // Apart only where a result lands by a rounding boundary or cancels: 1% of the moments (1 − β1 is
    // 0.100000024 in float there, 0.1 here), a few in ten thousand of the weights.
    EXPECT_LE(d.at(what).differ * 50, d.at(what).elements) << what;
  }
}

TEST(DeepSpeedCpuAdam, AdamL2WithBf16MomentsIsDeepSpeedsWithinOneBf16Ulp) {
  const auto d = run("adam_l2.bf16", optim::UpdateRule::AdamL2, optim::StatePrecision::BF16);
  for (const char* what : {"param", "exp_avg", "exp_avg_sq"}) {
    EXPECT_LE(d.at(what).max_scaled_ulps, 1.0) << what;
    EXPECT_LE(d.at(what).differ * 50, d.at(what).elements) << what;
  }
}

// fp32 moments (bf16_optimizer_states false): the weights within one bf16 ulp; the moments differ
// by DeepSpeed's float 1 - beta2 (1 - 0.999f = 0.00099998713) against shardlm's 0.001, 1.3e-5 relative.
TEST(DeepSpeedCpuAdam, AdamWWithFp32MomentsIsDeepSpeedsWithinOneBf16UlpAndItsFloatConstants) {
  const auto d = run("adamw.fp32", optim::UpdateRule::AdamW, optim::StatePrecision::FP32);
  EXPECT_LE(d.at("param").max_scaled_ulps, 1.0);
  EXPECT_LE(d.at("param").differ * 1000, d.at("param").elements);
  EXPECT_LT(d.at("exp_avg").max_relative, 1e-6);
  EXPECT_LT(d.at("exp_avg_sq").max_relative, 2e-5);
}
