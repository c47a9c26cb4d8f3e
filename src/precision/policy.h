// A run's precision, decided once from its config (bf16.enabled, fp16.enabled, or fp32; fp64 for
// tests): the dtype the model computes in, the dtype gradients accumulate in, whether the loss is
// scaled, and the name logs, memory.json, checkpoints and plans give it. Every caller asks the policy
// instead of re-deriving these from the flags, so the trainer holds no precision branch.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace shardlm::precision {

struct Policy {
  at::ScalarType compute = at::kFloat;
  at::ScalarType parameters = at::kFloat;  // the dtype a model is initialised in: fp32, fp64 for fp64
  std::string name = "fp32";          // "bf16" | "fp16" | "fp32" | "fp64"
  std::string planner_name = "fp32";  // the planner's precision (it models an fp64 test run as fp32)
  bool loss_scaling = false;          // fp16: dynamic (or static) loss scaling
  // The dtype gradients accumulate in: "bf16" keeps them in bf16; otherwise fp32 (fp64 for fp64).
  at::ScalarType grad_accum(const std::string& grad_accum_dtype) const;
  // Whether 16-bit products run as fp32 products on `device` (fp16 on a CPU, bf16 on a CPU without
  // native bf16 dot products): what the planner's temporaries depend on.
  bool products_in_fp32(const std::string& device) const;
  // One start-up line about how 16-bit products are computed on `device`, or "" when none applies.
  std::string describe_products(const c10::Device& device) const;
};

// The policy of bf16.enabled / fp16.enabled (at most one; the config refuses both) or float64.
Policy policy_for(bool bf16, bool fp16, bool float64);

}  // namespace shardlm::precision
