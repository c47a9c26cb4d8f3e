// See recompute.h. A reentrant checkpoint, as torch.utils.checkpoint(use_reentrant=True): the
// backward runs a nested autograd pass over the recomputed region.
#include "model/recompute.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <utility>

#include "model/weight_grad_deferral.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

thread_local bool t_replaying = false;
thread_local bool t_recomputed_forward = false;

// The default generator of `device` (CPU, or the GPU's).
at::Generator generator_of(const at::Device& device) {
  return device.is_cpu() ? at::globalContext().defaultGenerator(at::kCPU) : at::globalContext().defaultGenerator(device);
}

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
    // The generator's state before the region: the replay draws the same random numbers.
    const auto device = inputs.empty() ? at::Device(at::kCPU) : inputs[0].device();
    {
      auto gen = generator_of(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    at::NoGradGuard no_grad;
    const bool outer = std::exchange(t_recomputed_forward, true);
    try {
      auto out = region(inputs.vec());
      t_recomputed_forward = outer;
      return out;
    } catch (...) {
      t_recomputed_forward = outer;
      throw;
    }
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
      // The forward's random numbers for the replay; the generator continues where it was after.
      auto gen = generator_of(inputs.empty() ? at::Device(at::kCPU) : inputs[0].device());
      at::Tensor resume_state;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        resume_state = gen.get_state();
        gen.set_state(ctx->saved_data["rng"].toTensor());
      }
      const auto restore = [&] {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(resume_state);
      };
      at::AutoGradMode grad_on(true);
      std::optional<WeightGradQueue::Recording> recording;
      if (queue) recording.emplace(*queue);
      const bool outer = std::exchange(t_replaying, true);
      try {
        out = holder.region(inputs);
      } catch (...) {
        t_replaying = outer;
        restore();
        throw;
      }
      t_replaying = outer;
      restore();
    }
    // Deferred: the region's dX products now, its parameters' gradients queued for W. (A region
    // with nothing trainable, entered by the stand-in input alone, has no backward.)
    if (!out.requires_grad()) {
    } else if (queue) {
      queue->backward_inputs(out, grads[0], inputs);
    } else {
      torch::autograd::backward({out}, {grads[0]});
    }
    torch::autograd::variable_list result = {at::Tensor()};  // the region itself takes no gradient
    for (const auto& t : inputs) result.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    return result;
  }
};

}  // namespace

bool replaying_recomputation() { return t_replaying; }

bool training_forward() { return at::GradMode::is_enabled() || t_recomputed_forward; }

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
  for (const auto& t : inputs)
    if (t.requires_grad()) return RecomputeFunction::apply(region, at::TensorList(inputs));
  // No input needs a gradient, but the region may hold parameters that do (LoRA's adapters in the
  // first decoder layer after a frozen embedding). A custom function's output needs a gradient only
  // when an input does, so an empty input that needs one stands in (as PEFT's
  // enable_input_require_grads does on the embedding's output); the region never reads it.
  auto with = inputs;
  with.push_back(at::empty({0}, inputs.empty() ? at::TensorOptions() : inputs[0].options().dtype(at::kFloat))
                     .requires_grad_(true));
  return RecomputeFunction::apply(region, at::TensorList(with));
}

}  // namespace shardlm::model
