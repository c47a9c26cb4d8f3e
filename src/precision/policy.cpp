// See policy.h.
#include "precision/policy.h"

#include "model/fp32_products.h"

namespace shardlm::precision {

Policy policy_for(bool bf16, bool fp16, bool float64) {
  Policy p;
  if (bf16) {
    p.compute = at::kBFloat16;
    p.name = p.planner_name = "bf16";
  } else if (fp16) {
    p.compute = at::kHalf;
    p.name = p.planner_name = "fp16";
    p.loss_scaling = true;
  } else if (float64) {
    p.compute = p.parameters = at::kDouble;
    p.name = "fp64";
  }
  return p;
}

at::ScalarType Policy::grad_accum(const std::string& grad_accum_dtype) const {
  if (grad_accum_dtype == "bf16") return at::kBFloat16;
  return compute == at::kDouble ? at::kDouble : at::kFloat;
}

bool Policy::products_in_fp32(const std::string& device) const {
  return device == "cpu" && (compute == at::kHalf || (compute == at::kBFloat16 && model::bf16_products_in_fp32()));
}

std::string Policy::describe_products(const c10::Device& device) const {
  return compute == at::kBFloat16 && device.is_cpu() ? model::describe_bf16_products() : "";
}

}  // namespace shardlm::precision
