// See adamw.h. Mirrors torch/optim/adamw.py (_single_tensor_adamw; _multi_tensor_adamw does the same
// operations over lists) operation by operation, because the golden tests compare against it at 1e-6.
#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "util/error.h"

namespace shardlm::optim {

AdamW::AdamW(std::vector<Segment> segments, AdamWOptions options) : segments_(std::move(segments)), opt_(options) {
  for (const auto& s : segments_) {
    if (s.param.scalar_type() != at::kFloat && s.param.scalar_type() != at::kDouble)
      fail("AdamW: segment ", s.name, " must hold float32 (or float64) master weights");
    exp_avg_.push_back(at::zeros_like(s.param));
    exp_avg_sq_.push_back(at::zeros_like(s.param));
  }
}

namespace {

// Segments are updated in groups with the library's multi-tensor (_foreach_) ops: on a GPU one
// kernel launch covers many tensors; on the CPU each op runs tensor by tensor, the same
// arithmetic as a loop. A group is cut where the fp32 copies of 16-bit gradients it needs would
// exceed this many elements, so the update never holds a full fp32 gradient copy.
constexpr int64_t kMaxConvertedElements = int64_t{1} << 26;

}  // namespace

void AdamW::step(double lr, const std::vector<double>* grad_multipliers) {
  at::NoGradGuard no_grad;
  if (opt_.rule == UpdateRule::Lamb) return step_lamb(lr, grad_multipliers);
  ++step_;
  // bias_correction=false (DeepSpeed's FusedAdam option): the moments are used uncorrected.
  const double bias_correction1 = opt_.bias_correction ? 1.0 - std::pow(opt_.beta1, static_cast<double>(step_)) : 1.0;
  const double bias_correction2 = opt_.bias_correction ? 1.0 - std::pow(opt_.beta2, static_cast<double>(step_)) : 1.0;
  // Adam with L2 regularization (torch.optim.Adam, FusedAdam's ADAM_MODE_0): the decay term joins
  // the gradient before the moments see it, instead of shrinking the weights (AdamW).
  const bool l2 = opt_.rule == UpdateRule::AdamL2 && opt_.weight_decay != 0;
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  size_t begin = 0;
  while (begin < segments_.size()) {
    std::vector<at::Tensor> params, grads, avgs, avg_sqs, decayed;
    int64_t converted = 0;
    size_t i = begin;
    for (; i < segments_.size(); ++i) {
      auto& param = segments_[i].param;
      // Mixed precision keeps 16-bit gradients next to fp32 master weights: update in the master's dtype.
      const auto& raw_grad = segments_[i].grad;
      const double multiplier = grad_multipliers ? (*grad_multipliers)[i] : 1.0;
      const bool add_l2 = l2 && segments_[i].decay;
      const bool convert = raw_grad.scalar_type() != param.scalar_type() || multiplier != 1.0 || add_l2;
      if (convert && converted > 0 && converted + raw_grad.numel() > kMaxConvertedElements) break;
      auto grad = raw_grad.scalar_type() == param.scalar_type() ? raw_grad : raw_grad.to(param.scalar_type());
      if (multiplier != 1.0) grad = grad * multiplier;
      if (add_l2) grad = grad.add(param, opt_.weight_decay);  // torch.optim.Adam: grad.add(param, alpha=wd)
      if (convert) converted += grad.numel();
      params.push_back(param);
      grads.push_back(grad);
      avgs.push_back(exp_avg_[i]);
      avg_sqs.push_back(exp_avg_sq_[i]);
      if (segments_[i].decay) decayed.push_back(param);
    }
    begin = i;
    if (!decayed.empty() && opt_.rule == UpdateRule::AdamW) at::_foreach_mul_(decayed, 1.0 - lr * opt_.weight_decay);
    at::_foreach_mul_(avgs, opt_.beta1);
    at::_foreach_add_(avgs, grads, 1.0 - opt_.beta1);
    at::_foreach_mul_(avg_sqs, opt_.beta2);
    at::_foreach_addcmul_(avg_sqs, grads, grads, 1.0 - opt_.beta2);
    auto denoms = at::_foreach_sqrt(avg_sqs);
    at::_foreach_div_(denoms, bias_correction2_sqrt);
    at::_foreach_add_(denoms, opt_.eps);
    at::_foreach_addcdiv_(params, avgs, denoms, -step_size);
  }
}

// DeepSpeed's FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu, pinned 0.19.8), segment by segment:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   update = m / (sqrt(v) + eps) + wd p        (eps_inside_sqrt: m / sqrt(v + eps))
//   coeff = ||p|| / ||update|| clamped to [min_coeff, max_coeff] (1 when either norm is 0)
//   p -= step_size * coeff * update,  step_size = lr sqrt(1 - b2^t) / (1 - b1^t)  (lr without bias_correction)
void AdamW::step_lamb(double lr, const std::vector<double>* grad_multipliers) {
  ++step_;
  double step_size = lr;
  if (opt_.bias_correction) {
    const double bias_correction1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step_));
    const double bias_correction2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(step_));
    step_size = lr * std::sqrt(bias_correction2) / bias_correction1;
  }
  lamb_coeffs_.assign(segments_.size(), 1.0);
  for (size_t i = 0; i < segments_.size(); ++i) {
    auto& param = segments_[i].param;
    const auto& raw_grad = segments_[i].grad;
    auto grad = raw_grad.scalar_type() == param.scalar_type() ? raw_grad : raw_grad.to(param.scalar_type());
    if (grad_multipliers && (*grad_multipliers)[i] != 1.0) grad = grad * (*grad_multipliers)[i];
    auto& m = exp_avg_[i];
    auto& v = exp_avg_sq_[i];
    m.mul_(opt_.beta1).add_(grad, 1.0 - opt_.beta1);
    v.mul_(opt_.beta2).addcmul_(grad, grad, 1.0 - opt_.beta2);
    const auto denom = opt_.eps_inside_sqrt ? (v + opt_.eps).sqrt() : v.sqrt().add_(opt_.eps);
    auto update = m / denom;
    if (segments_[i].decay && opt_.weight_decay != 0) update.add_(param, opt_.weight_decay);
    const auto norms = at::stack({param.norm(2), update.norm(2)}).to(at::kCPU, at::kDouble);
    const double w = norms[0].item<double>(), u = norms[1].item<double>();
    double coeff = 1.0;
    if (w != 0 && u != 0) {
      coeff = w / u;
      if (coeff > opt_.max_coeff) coeff = opt_.max_coeff;
      if (coeff < opt_.min_coeff) coeff = opt_.min_coeff;
    }
    lamb_coeffs_[i] = coeff;
    param.add_(update, -step_size * coeff);
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < segments_.size(); ++i) {
    out.emplace_back(segments_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(segments_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& state, int64_t step) {
  for (size_t i = 0; i < segments_.size(); ++i) {
    for (auto* pair : {&exp_avg_, &exp_avg_sq_}) {
      const std::string key = segments_[i].name + (pair == &exp_avg_ ? ".exp_avg" : ".exp_avg_sq");
      auto it = state.find(key);
      if (it == state.end()) fail("optimizer state has no tensor ", key);
      if (it->second.sizes() != (*pair)[i].sizes())
        fail("optimizer state tensor ", key, " has shape ", it->second.sizes(), ", expected ", (*pair)[i].sizes());
      (*pair)[i].copy_(it->second);
    }
  }
  step_ = step;
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) b += 2 * exp_avg_[i].numel() * exp_avg_[i].element_size();
  return b;
}

double local_grad_sum_of_squares(const std::vector<at::Tensor>& grads, const std::vector<double>* weights) {
  if (grads.empty()) return 0.0;
  // Norms computed where the gradients live, read back in one transfer, summed in double here.
  std::vector<at::Tensor> norms;
  for (const auto& g : grads) norms.push_back(g.detach().norm(2));
  const auto host = at::stack(norms).to(at::kCPU, at::kDouble);
  const double* v = host.data_ptr<double>();
  double sum = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) sum += v[i] * v[i] * (weights ? (*weights)[i] : 1.0);
  return sum;
}

void clip_grads(const std::vector<at::Tensor>& grads, double total_norm, double max_norm) {
  if (max_norm <= 0) return;
  // torch computes clip_coef in float32 from a float32 total norm; match that rounding.
  const float norm32 = static_cast<float>(total_norm);
  const float coef = static_cast<float>(max_norm) / (norm32 + 1e-6f);
  const float clamped = coef < 1.0f ? coef : 1.0f;
  at::NoGradGuard no_grad;
  for (const auto& g : grads) g.detach().mul_(clamped);
}

}  // namespace shardlm::optim
