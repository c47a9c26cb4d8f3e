// Runs a callback once a parameter's gradient for this backward is complete: a post hook on the
// parameter's AccumulateGrad node, the point at which .grad holds the accumulated sum. (A tensor
// hook fires before accumulation, too early to read the gradient.) Both data parallelism and ZeRO
// start their reductions from here.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace shardlm::parallel {

// `keep_alive` must outlive the hook: autograd holds the accumulator only weakly.
void on_gradient_ready(const at::Tensor& param, std::function<void()> callback,
                       std::vector<std::shared_ptr<void>>& keep_alive);

}  // namespace shardlm::parallel
