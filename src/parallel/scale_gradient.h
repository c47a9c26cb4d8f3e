// scale_gradient(x, factor): identity in forward; in backward multiplies the incoming gradient by
// `factor`, in fp32 and rounded once to the gradient's dtype (a 16-bit product with the factor
// itself rounded to 16 bits, as a scalar operand can be, would turn a tiny factor into zero).
// Placed on a unit's output, ZeRO's per-unit loss scaling moves the backward signal from the scale
// of the unit above to this unit's own; the fault-injection seam attenuates a unit's signal with it.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardlm::parallel {

struct ScaleGradient : public torch::autograd::Function<ScaleGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double factor) {
    ctx->saved_data["factor"] = factor;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& g = grads[0];
    const double factor = ctx->saved_data["factor"].toDouble();
    if (at::elementSize(g.scalar_type()) >= 4) return {g * factor, at::Tensor()};
    return {(g.to(at::kFloat) * factor).to(g.scalar_type()), at::Tensor()};
  }
};

inline at::Tensor scale_gradient(const at::Tensor& x, double factor) { return ScaleGradient::apply(x, factor); }

}  // namespace shardlm::parallel
