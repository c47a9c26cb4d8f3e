// See recompute.h. A reentrant checkpoint, as torch.utils.checkpoint(use_reentrant=True): the
// backward runs a nested autograd pass over the recomputed region.
#include "model/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <utility>

#include "model/weight_grad_deferral.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

thread_local bool t_replaying = false;

// Carries the region from forward to backward (autograd's saved data holds IValues).
struct RegionHolder : torch::CustomClassHolder {
  explicit RegionHolder(Region r) : region(std::move(r)) {}
  Region region;
};

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `inputs` must arrive as a TensorList: that is how autograd counts each tensor as an input.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const Region& region, at::TensorList inputs) {
    ctx->saved_data["region"] = at::IValue::make_capsule(c10::make_intrusive<RegionHolder>(region));
    ctx->save_for_backward(inputs.vec());
    // Under a weight-gradient deferral (zb_h1's F), the recomputation in B defers into the same queue.
    ctx->saved_data["queue"] = reinterpret_cast<int64_t>(WeightGradQueue::recording());
    at::NoGradGuard no_grad;
    return region(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto capsule = ctx->saved_data["region"].toCapsule();
    const auto& holder = *static_cast<RegionHolder*>(capsule.get());
    auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (const auto& t : saved) inputs.push_back(t.detach().requires_grad_(t.requires_grad()));
    auto* queue = reinterpret_cast<WeightGradQueue*>(ctx->saved_data["queue"].toInt());
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      std::optional<WeightGradQueue::Recording> recording;
      if (queue) recording.emplace(*queue);
      const bool outer = std::exchange(t_replaying, true);
      try {
        out = holder.region(inputs);
      } catch (...) {
        t_replaying = outer;
        throw;
      }
      t_replaying = outer;
    }
    // Deferred: the region's dX products now, its parameters' gradients queued for W.
    if (queue) queue->backward_inputs(out, grads[0], inputs);
    else torch::autograd::backward({out}, {grads[0]});
    torch::autograd::variable_list result = {at::Tensor()};  // the region itself takes no gradient
    for (const auto& t : inputs) result.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    return result;
  }
};

}  // namespace

bool replaying_recomputation() { return t_replaying; }

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "full") return Recompute::Full;
  if (name == "selective") return Recompute::Selective;
  fail("activation_checkpointing.mode must be \"none\", \"full\" or \"selective\", got \"", name, "\"");
}

const char* recompute_name(Recompute r) {
  return r == Recompute::Full ? "full" : r == Recompute::Selective ? "selective" : "none";
}

at::Tensor recomputed(const Region& region, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return region(inputs);  // evaluation: nothing to save anyway
  return RecomputeFunction::apply(region, at::TensorList(inputs));
}

}  // namespace shardlm::model
