// LoRA's pieces of arithmetic (model/lora.h): the frozen base, its no-dW product, the adapter's
// output and PEFT's initialisations. Which linears are adapted is lora_targets.cpp.
#include "model/lora.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "model/fp32_products.h"
#include "model/recompute.h"
#include "util/error.h"

namespace shardlm::model {

PlainFrozenBase::PlainFrozenBase(std::vector<std::pair<std::string, at::Tensor>> tensors) : tensors_(std::move(tensors)) {
  for (auto& [name, t] : tensors_) t = t.detach().set_requires_grad(false);
}

int64_t PlainFrozenBase::bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

void PlainFrozenBase::to(at::Device device, at::ScalarType dtype) {
  for (auto& [name, t] : tensors_) t = t.to(device, dtype);
}

namespace {

struct BaseHolder : torch::CustomClassHolder {
  explicit BaseHolder(std::shared_ptr<const FrozenBase> b) : base(std::move(b)) {}
  std::shared_ptr<const FrozenBase> base;
};

// Forward: x W^T. Saves the store and k, not W (a quantized store would otherwise keep the
// dequantized weight alive until backward). Backward: dX = dY W from a fresh weight(k); no dW.
struct FrozenLinear : public torch::autograd::Function<FrozenLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::shared_ptr<const FrozenBase>& base, int64_t k) {
    ctx->saved_data["base"] = at::IValue::make_capsule(c10::make_intrusive<BaseHolder>(base));
    ctx->saved_data["k"] = k;
    at::NoGradGuard no_grad;
    return model::linear(x, base->weight(static_cast<size_t>(k)));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto capsule = ctx->saved_data["base"].toCapsule();
    const auto& holder = *static_cast<BaseHolder*>(capsule.get());
    const auto w = holder.base->weight(static_cast<size_t>(ctx->saved_data["k"].toInt()));
    return {model::linear(grads[0], w.t()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor frozen_linear(const at::Tensor& x, std::shared_ptr<const FrozenBase> base, size_t k) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return model::linear(x, base->weight(k));
  return FrozenLinear::apply(x, base, static_cast<int64_t>(k));
}

at::Tensor lora_down(const at::Tensor& x, const at::Tensor& a, double dropout) {
  // PEFT: lora_B(lora_A(dropout(x))) * scaling; nn.Dropout is active in training (here: while
  // autograd records, or in a recomputed region's forward, which replays the same mask), identity
  // in evaluation.
  const auto in = dropout > 0 && training_forward() ? at::dropout(x, dropout, /*train=*/true) : x;
  return model::linear(in, a);
}

at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scaling, double dropout) {
  return model::linear(lora_down(x, a, dropout), b) * scaling;
}

void init_lora_pair(at::Tensor& a, at::Tensor& b, const std::string& init, at::Generator& gen) {
  init_lora_pair_of_rank(a, b, init, gen, a.size(0));
}

void init_lora_pair_of_rank(at::Tensor& a, at::Tensor& b, const std::string& init, at::Generator& gen, int64_t r) {
  at::NoGradGuard no_grad;
  // nn.init.kaiming_uniform_(w, a=sqrt(5)) (nn.Linear's reset_parameters): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const auto kaiming = [&gen](at::Tensor& w) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(w.size(1)));
    w.uniform_(-bound, bound, gen);
  };
  if (init == "true") {
    kaiming(a);
    b.zero_();
  } else if (init == "gaussian") {
    a.normal_(0.0, 1.0 / static_cast<double>(r), gen);
    b.zero_();
  } else if (init == "false") {  // PEFT leaves both as nn.Linear initialised them
    kaiming(a);
    kaiming(b);
  } else {
    fail("lora.init_lora_weights must be true, false or \"gaussian\", got \"", init,
         "\" (PEFT's other initialisations — pissa, olora, loftq, eva, corda — are not implemented)");
  }
}

std::string lora_base_name(const LoraTarget& t) {
  return "model.layers." + std::to_string(t.layer) + "." + t.module + (t.experts > 0 ? "" : ".weight");
}

std::string lora_adapter_prefix(const LoraTarget& t) {
  return "model.layers." + std::to_string(t.layer) + "." + (t.adapter_module.empty() ? t.module : t.adapter_module);
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> lora_pair_shapes(const LoraTarget& t,
                                                                        const std::vector<int64_t>& w) {
  // ParamWrapper._get_in_out_features: a 3-D [E, d1, d2] weight that is not is_transposed (no family
  // here is) has in_features d2 and out_features d1.
  if (t.experts > 0) return {{t.r * t.experts, w.at(2)}, {w.at(1), t.r * t.experts}};
  return {{t.r, w.at(1)}, {w.at(0), t.r}};
}

namespace {

// ParamWrapper.get_delta_factors: lhs [E, out, r] (B's columns j*E + e), rhs [E, r, in] (A's rows).
std::pair<at::Tensor, at::Tensor> expert_lora_factors(const at::Tensor& a, const at::Tensor& b, int64_t experts) {
  const auto rhs = a.reshape({experts, -1, a.size(1)});
  const auto lhs = b.reshape({b.size(0), -1, experts}).permute({2, 0, 1});
  return {lhs, rhs};
}

}  // namespace

at::Tensor expert_lora_weight(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scaling) {
  const int64_t experts = w.size(0);
  auto [lhs, rhs] = expert_lora_factors(a.to(w.scalar_type()), b.to(w.scalar_type()), experts);
  // ParamWrapper._activate_lora: one adapter folds through _LoraFactorsProxy, baddbmm in the weight's
  // dtype (fp32, fp64, bf16, fp16 alike; only float8 weights, UPCAST_DTYPES, add a formed delta instead).
  return at::baddbmm(w, lhs, rhs, 1.0, scaling);
}

at::Tensor expert_lora_delta(const at::Tensor& a, const at::Tensor& b, int64_t experts, double scaling) {
  // get_delta_weight: einsum("o r e, e r i -> e o i", B, A) * scaling.
  auto [lhs, rhs] = expert_lora_factors(a, b, experts);
  return at::bmm(lhs, rhs) * scaling;
}

}  // namespace shardlm::model
