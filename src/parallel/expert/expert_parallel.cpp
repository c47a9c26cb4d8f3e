// See expert_parallel.h.
#include "parallel/expert/expert_parallel.h"

#include <ATen/ATen.h>

#include "parallel/expert/expert_dispatch.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

bool expert_tensor(const std::string& name) {
  return name.find(".mlp.experts.gate_up_proj") != std::string::npos ||
         name.find(".mlp.experts.down_proj") != std::string::npos;
}

}  // namespace

void ExpertParallel::check(const model::LlamaConfig& cfg, int ep) {
  if (ep <= 1) return;
  if (!cfg.is_moe())
    fail("parallelism.expert_parallel = ", ep, " but model_type ", cfg.model_type,
         " is a dense model (no experts to split); set parallelism.expert_parallel to 1 or train a mixture-of-experts "
         "model (mixtral, qwen2_moe, qwen3_moe)");
  if (cfg.num_experts % ep != 0)
    fail("parallelism.expert_parallel = ", ep, " does not divide the model's ", cfg.num_experts,
         " experts (num_experts / num_local_experts); set it to a divisor of ", cfg.num_experts,
         " that divides the data-parallel ranks too");
}

ExpertParallel::ExpertParallel(model::Llama& model, comm::CommPtr ep, comm::CommPtr edp, int dp)
    : ep_(std::move(ep)), edp_(std::move(edp)), dp_(dp) {
  const auto& cfg = model.config();
  check(cfg, ep_->size());
  const int64_t El = cfg.num_experts / ep_->size(), first = El * ep_->rank();
  auto& params = model.parameters();
  is_expert_.assign(params.size(), 0);
  first_element_.assign(params.size(), 0);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!expert_tensor(params[i].name)) continue;
    auto& t = params[i].tensor;
    if (t.size(0) != cfg.num_experts)
      fail("expert parallelism: ", params[i].name, " holds ", t.size(0), " experts, the config ", cfg.num_experts,
           " (internal error: split twice?)");
    is_expert_[i] = 1;
    first_element_[i] = first * (t.numel() / t.size(0));
    t = t.narrow(0, first, El).clone().set_requires_grad(true);
  }
  model.set_expert_dispatch(expert::make_expert_dispatch(ep_, El));
}

int64_t ExpertParallel::first_element(size_t param) const { return first_element_[param]; }

std::vector<std::pair<std::string, at::Tensor>> ExpertParallel::unshard(
    std::vector<std::pair<std::string, at::Tensor>> local) const {
  for (size_t i = 0; i < local.size() && i < is_expert_.size(); ++i) {
    if (!is_expert_[i] || !local[i].second.defined()) continue;  // undefined: another engine's (expert_zero.h)
    auto& t = local[i].second;
    const auto mine = t.detach().contiguous();
    auto sizes = mine.sizes().vec();
    sizes[0] *= size();
    auto all = at::empty(sizes, mine.options());
    ep_->all_gather(mine.view({-1}), all.view({-1}));
    t = all;
  }
  return local;
}

}  // namespace shardlm::parallel
