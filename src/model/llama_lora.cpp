// The Llama's LoRA side (model/lora.h): reading a base tensor that may be frozen, the adapted
// linear, moving the base into a FrozenBase when adapters are applied, and the merged export.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <set>

#include "model/fp32_products.h"
#include "model/llama.h"
#include "util/error.h"

namespace shardlm::model {

at::Tensor Llama::base(size_t b) const {
  if (base_refs_.empty()) return p(b);
  const auto& r = base_refs_[b];
  return r.param >= 0 ? p(static_cast<size_t>(r.param)) : frozen_->weight(static_cast<size_t>(r.frozen));
}

int64_t Llama::base_rows(size_t b) const {
  if (base_refs_.empty()) return params_[b].tensor.size(0);
  const auto& r = base_refs_[b];
  return r.param >= 0 ? params_[static_cast<size_t>(r.param)].tensor.size(0) : frozen_rows_[static_cast<size_t>(r.frozen)];
}

at::Tensor Llama::linear_slot(const at::Tensor& x, int64_t layer, int s, bool leaves) const {
  const auto leave = [this, leaves](const at::Tensor& t) { return leaves && regions_ ? regions_->leave(t) : t; };
  const int b = layer_slots_[static_cast<size_t>(layer)][s];
  if (base_refs_.empty()) return leave(model::linear(x, p(static_cast<size_t>(b))));
  const auto& r = base_refs_[static_cast<size_t>(b)];
  auto y = leave(r.frozen >= 0 ? frozen_linear(x, frozen_, static_cast<size_t>(r.frozen))
                               : model::linear(x, p(static_cast<size_t>(r.param))));
  const int a = adapter_slots_[static_cast<size_t>(layer)][s];
  if (a < 0) return y;
  const auto& ad = adapters_[static_cast<size_t>(a)];
  if (!leaves) return y + lora_delta(x, p(ad.a), p(ad.b), ad.scaling, lora_.dropout);
  // Row-parallel: each rank's x A_r^T is a partial sum of the r-wide x A^T; leave() completes it
  // (an all-reduce, or a reduce-scatter along the sequence), then the whole B applies.
  return y + model::linear(leave(lora_down(x, p(ad.a), lora_.dropout)), p(ad.b)) * ad.scaling;
}

at::Tensor Llama::expert_slot(int64_t layer, int s) const {
  const auto w = slot(layer, s);
  const int a = adapter_slots_.empty() ? -1 : adapter_slots_[static_cast<size_t>(layer)][static_cast<size_t>(s)];
  if (a < 0) return w;
  const auto& ad = adapters_[static_cast<size_t>(a)];
  return expert_lora_weight(w, p(ad.a), p(ad.b), ad.scaling);
}

void Llama::apply_lora(const LoraPlan& plan, uint64_t seed) {
  if (frozen_) fail("apply_lora: the model already has adapters (internal error)");
  if (regions_) fail("apply_lora: call it before tensor parallelism shards the model (internal error)");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].name] = i;
  const std::set<std::string> full(plan.trained_in_full.begin(), plan.trained_in_full.end());
  // Base tensor b -> the unit that held it (the adapters join their layer's unit).
  std::vector<size_t> unit_of(params_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i : units_[u].params) unit_of[i] = u;
  std::vector<Parameter> trainable;
  std::vector<std::pair<std::string, at::Tensor>> frozen;
  std::vector<std::vector<size_t>> unit_params(units_.size());
  base_refs_.assign(params_.size(), {});
  for (size_t b = 0; b < params_.size(); ++b) {
    if (full.count(params_[b].name)) {
      base_refs_[b].param = static_cast<int>(trainable.size());
      unit_params[unit_of[b]].push_back(trainable.size());
      trainable.push_back(params_[b]);
    } else {
      base_refs_[b].frozen = static_cast<int>(frozen.size());
      frozen_rows_.push_back(params_[b].tensor.size(0));
      frozen.emplace_back(params_[b].name, params_[b].tensor);
    }
  }
  // Adapters in target order (layer by layer, modules in parameter order), A then B, from one generator.
  auto gen = at::detail::createCPUGenerator(seed ^ 0x4c6f5241ull);  // "LoRA": independent of the base's draws
  adapter_slots_.assign(static_cast<size_t>(cfg_.num_hidden_layers), std::vector<int>(layer_slots_.empty() ? 0 : layer_slots_[0].size(), -1));
  const auto dtype = params_[0].tensor.scalar_type();
  for (const auto& t : plan.targets) {
    const auto weight_name = lora_base_name(t);
    const auto it = index.find(weight_name);
    if (it == index.end()) fail("lora: this model has no ", weight_name, " (internal error)");
    const auto& slots = layer_slots_[static_cast<size_t>(t.layer)];
    int s = -1;
    for (size_t k = 0; k < slots.size(); ++k)
      if (slots[k] == static_cast<int>(it->second)) s = static_cast<int>(k);
    const auto& w = params_[it->second].tensor;
    if (t.experts > 0 && w.dim() != 3)
      fail("lora.target_parameters: ", weight_name, " is not a 3-D expert weight (internal error)");
    const auto [a_shape, b_shape] = lora_pair_shapes(t, w.sizes().vec());
    auto a = at::empty(a_shape, w.options().dtype(dtype));
    auto bm = at::empty(b_shape, w.options().dtype(dtype));
    init_lora_pair_of_rank(a, bm, plan.init, gen, t.r);
    const auto prefix = lora_adapter_prefix(t);
    const size_t ai = trainable.size();
    lora_shapes_.emplace_back(prefix + ".lora_A.weight", a.sizes().vec());
    lora_shapes_.emplace_back(prefix + ".lora_B.weight", bm.sizes().vec());
    trainable.push_back({prefix + ".lora_A.weight", a.set_requires_grad(true)});
    trainable.push_back({prefix + ".lora_B.weight", bm.set_requires_grad(true)});
    unit_params[unit_of[it->second]].insert(unit_params[unit_of[it->second]].end(), {ai, ai + 1});
    adapter_slots_[static_cast<size_t>(t.layer)][static_cast<size_t>(s)] = static_cast<int>(adapters_.size());
    adapters_.push_back({ai, ai + 1, t.scaling, t.experts});
  }
  // Parameters in unit order, so that each unit's parameters stay contiguous and ordered.
  std::vector<Parameter> ordered;
  std::vector<int> moved(trainable.size(), -1);
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].also_reads.clear();  // the tied embedding is frozen (trained in full only untied)
    for (auto& i : unit_params[u]) {
      moved[i] = static_cast<int>(ordered.size());
      ordered.push_back(trainable[i]);
      i = static_cast<size_t>(moved[i]);
    }
    units_[u].params = unit_params[u];
  }
  for (auto& r : base_refs_)
    if (r.param >= 0) r.param = moved[static_cast<size_t>(r.param)];
  for (auto& ad : adapters_) ad.a = static_cast<size_t>(moved[ad.a]), ad.b = static_cast<size_t>(moved[ad.b]);
  params_ = std::move(ordered);
  frozen_ = std::make_shared<PlainFrozenBase>(std::move(frozen));
  lora_ = plan;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Llama::full_shapes() const {
  if (!frozen_) return describe(cfg_).params;
  std::map<std::string, std::vector<int64_t>> shape(lora_shapes_.begin(), lora_shapes_.end());
  for (const auto& [name, dims] : describe(cfg_).params) shape.emplace(name, dims);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& prm : params_) out.emplace_back(prm.name, shape.at(prm.name));
  return out;
}

void Llama::shard_frozen_base(const std::function<at::Tensor(const std::string&, const at::Tensor&)>& piece) {
  const auto* plain = dynamic_cast<const PlainFrozenBase*>(frozen_.get());
  if (!plain)
    fail("tensor parallelism with a 4-bit (QLoRA) base is not built: bitsandbytes' blocks run over the whole weight; "
         "set parallelism.tensor_parallel to 1");
  std::vector<std::pair<std::string, at::Tensor>> pieces;
  for (const auto& [name, t] : plain->tensors()) pieces.emplace_back(name, piece(name, t).contiguous().clone());
  frozen_ = std::make_shared<PlainFrozenBase>(std::move(pieces));
  // The local rows (heads, MLP width, vocabulary) the forward reads off base_rows().
  for (size_t b = 0; b < base_refs_.size(); ++b)
    if (base_refs_[b].frozen >= 0)
      frozen_rows_[static_cast<size_t>(base_refs_[b].frozen)] = frozen_->weight(static_cast<size_t>(base_refs_[b].frozen)).size(0);
}

void Llama::release_frozen_units(const std::vector<bool>& held) {
  if (!frozen_) return;
  const auto shape = describe(cfg_);  // its units list base tensors, as base_refs_ does
  std::vector<bool> keep(base_refs_.size(), false);
  for (size_t u = 0; u < shape.units.size() && u < held.size(); ++u) {
    if (!held[u]) continue;
    for (size_t b : shape.units[u].params) keep[b] = true;
    for (size_t o : shape.units[u].also_reads)
      for (size_t b : shape.units[o].params) keep[b] = true;
  }
  for (size_t b = 0; b < base_refs_.size(); ++b)
    if (!keep[b] && base_refs_[b].frozen >= 0) frozen_->release(static_cast<size_t>(base_refs_[b].frozen));
}

void Llama::set_frozen_base(std::shared_ptr<FrozenBase> store) {
  if (!frozen_ || !store || store->size() != frozen_->size())
    fail("set_frozen_base: the store must replace the frozen base tensor for tensor (internal error)");
  for (size_t k = 0; k < store->size(); ++k)
    if (store->name(k) != frozen_->name(k))
      fail("set_frozen_base: tensor ", k, " is ", store->name(k), ", the frozen base has ", frozen_->name(k), " (internal error)");
  frozen_ = std::move(store);
}

std::vector<std::pair<std::string, at::Tensor>> Llama::merged_tensors() const {
  if (!frozen_) return named_tensors();
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::map<size_t, const Adapter*> adapter_of_base;
  for (size_t l = 0; l < adapter_slots_.size(); ++l)
    for (size_t s = 0; s < adapter_slots_[l].size(); ++s)
      if (adapter_slots_[l][s] >= 0) adapter_of_base[static_cast<size_t>(layer_slots_[l][s])] = &adapters_[static_cast<size_t>(adapter_slots_[l][s])];
  for (size_t b = 0; b < base_refs_.size(); ++b) {
    const auto& r = base_refs_[b];
    if (r.param >= 0) {
      out.emplace_back(params_[static_cast<size_t>(r.param)].name, params_[static_cast<size_t>(r.param)].tensor.detach().clone());
      continue;
    }
    auto w = frozen_->weight(static_cast<size_t>(r.frozen)).detach().clone();
    if (const auto it = adapter_of_base.find(b); it != adapter_of_base.end()) {
      const auto& ad = *it->second;
      // PEFT's get_delta_weight: B @ A * scaling (per expert for a ParamWrapper), in the weight's dtype.
      const auto a = params_[ad.a].tensor.detach().to(at::kDouble), bm = params_[ad.b].tensor.detach().to(at::kDouble);
      const auto delta = ad.experts > 0 ? expert_lora_delta(a, bm, ad.experts, ad.scaling) : at::matmul(bm, a) * ad.scaling;
      w = (w.to(at::kDouble) + delta.to(w.device())).to(w.scalar_type());
    }
    out.emplace_back(frozen_->name(static_cast<size_t>(r.frozen)), w);
  }
  return out;
}

}  // namespace shardlm::model
