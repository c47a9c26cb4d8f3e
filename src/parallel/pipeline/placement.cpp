// See placement.h.
#include "parallel/pipeline/placement.h"

#include <ATen/ATen.h>

#include "util/error.h"

namespace shardlm::parallel {

PipelinePlacement::PipelinePlacement(model::Llama& model, comm::CommPtr pp, const std::vector<int64_t>& counts,
                                     int chunks)
    : pp_(std::move(pp)) {
  const int p = pp_->size(), s = pp_->rank();
  if (static_cast<int>(counts.size()) != p * chunks)
    fail("pipeline placement: ", counts.size(), " layer counts for ", p, " stages x ", chunks, " chunks (internal error)");
  for (int c = 0; c < chunks; ++c) units_.push_back(pp::stage_units(counts, c * p + s));
  auto& params = model.parameters();
  held_.assign(params.size(), false);
  owner_.assign(params.size(), 0);
  norm_weights_.assign(params.size(), 1.0);
  const auto& units = model.units();
  for (int k = 0; k < p * chunks; ++k) {  // virtual stage k lives on rank k % p
    const auto su = pp::stage_units(counts, k);
    for (size_t u = su.first; u <= su.last; ++u)
      for (size_t i : units[u].params) owner_[i] = k % p;
  }
  for (const auto& su : units_)
    for (size_t u = su.first; u <= su.last; ++u)
      for (size_t i : units[u].params) held_[i] = true;
  // With LoRA a tied embedding is frozen (model/lora.h): no copy of it is a parameter.
  const bool tied = model.config().tie_word_embeddings && p > 1 && !model.has_lora();
  if (tied && s == p - 1) {  // the head's copy of the embedding
    held_[0] = true;
    norm_weights_[0] = 0.0;
  }
  if (tied) tied_ = pp_->split(s == 0 || s == p - 1 ? 0 : 1, s, "pp_tied");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i)
    if (!held_[i]) params[i].tensor = at::empty({0}, params[i].tensor.options()).set_requires_grad(true);
  // LoRA: the frozen base of the other stages' units goes too.
  std::vector<bool> held_units(units.size(), false);
  for (const auto& su : units_)
    for (size_t u = su.first; u <= su.last; ++u) held_units[u] = true;
  model.release_frozen_units(held_units);
}

void PipelinePlacement::sum_tied_gradients(const at::Tensor& embedding_grad) const {
  if (!tied_ || (stage() != 0 && stage() != stages() - 1)) return;
  tied_->all_reduce(embedding_grad);
}

std::vector<std::pair<std::string, at::Tensor>> PipelinePlacement::gather_to_first(
    const std::vector<std::pair<std::string, at::Tensor>>& local, const std::vector<std::vector<int64_t>>& shapes,
    const std::vector<char>& only) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < local.size(); ++i) {
    if (!only.empty() && !only[i]) {
      out.push_back(local[i]);
      continue;
    }
    // Only stage 0 keeps the tensors, on the CPU: the whole model never sits on one device.
    const auto& [name, t] = local[i];
    at::Tensor buffer;
    if (stage() == owner_[i]) buffer = t.to(at::kCPU).contiguous();
    else if (stage() == 0) buffer = at::empty(shapes[i], t.options().device(at::kCPU));
    if (owner_[i] != 0) {  // a send from the owner, a receive at stage 0
      if (stage() == owner_[i]) pp_->send(buffer, 0, static_cast<int>(i));
      else if (stage() == 0) pp_->recv(buffer, owner_[i], static_cast<int>(i));
    }
    out.emplace_back(name, stage() == 0 ? buffer : at::Tensor());
  }
  return out;
}

}  // namespace shardlm::parallel
