#include "parallel/grad_ready_hook.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "util/error.h"

namespace shardlm::parallel {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

void on_gradient_ready(const at::Tensor& param, std::function<void()> callback,
                       std::vector<std::shared_ptr<void>>& keep_alive) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  if (!accumulator) fail("gradient hook: the tensor is not a leaf that requires grad");
  accumulator->add_post_hook(std::make_unique<GradReadyHook>(std::move(callback)));
  keep_alive.push_back(accumulator);
}

}  // namespace shardlm::parallel
