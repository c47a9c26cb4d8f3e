// See zero_engine.h: the engine that composes a stage's policies; the optimizer-state placement's
// part of it is state_placement.cpp.
#include "parallel/zero/zero_engine.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <cstdlib>
#include <string>
#include <cmath>

#include "comm/flight_recorder.h"
#include "parallel/grad_ready_hook.h"
#include "parallel/scale_gradient.h"
#include "parallel/zero/stage3_schedule.h"
#include "util/error.h"

namespace shardlm::parallel {

ZeroEngine::ZeroEngine(model::Llama& model, comm::CommPtr dp, ZeroOptions options, optim::AdamWOptions adam)
    : model_(model), dp_(std::move(dp)), options_(options), adam_options_(adam) {
  if (options_.stage < 0 || options_.stage > 3) fail("zero_optimization.stage must be 0, 1, 2 or 3");
  if (options_.replicas && options_.stage == 0)
    fail("hybrid sharding needs ZeRO stage 1, 2 or 3 (stage 0 shards nothing); set zero_optimization.stage");
  if (options_.per_unit_loss_scaling && model.config().tie_word_embeddings)
    fail("fp16.per_unit_loss_scaling with tie_word_embeddings: the shared embedding would collect gradients at two "
         "different scales; untie the embeddings or use one loss scale");
  if (options_.offload_nvme && options_.stage == 0)
    fail("zero_optimization.offload_optimizer.device \"nvme\" needs ZeRO stage 1, 2 or 3 (DeepSpeed offloads only "
         "under ZeRO); set zero_optimization.stage to 1, 2 or 3");
  if (options_.offload_cpu && options_.stage == 0)
    fail("internal: the host optimizer needs ZeRO stage 1, 2 or 3 (config_options.cpp sets offload_cpu only there)");
  policies_ = zero_policies(options_.stage, {options_.offload_cpu, options_.offload_nvme,
                                             options_.host_buffers_apart || !options_.device.is_cpu(),
                                             options_.offload_param_nvme, options_.offload_param_apart});
  const int n = shards();
  auto& params = model_.parameters();
  apart_ = policies_.states_apart;
  // Start from rank 0's weights, then pack them into flat units.
  {
    at::NoGradGuard no_grad;
    for (auto& p : params) {
      if (!packs(static_cast<size_t>(&p - params.data()))) continue;
      if (options_.replicas && options_.replicas->size() > 1) options_.replicas->broadcast(p.tensor.detach(), 0);
      if (dp_->size() > 1) dp_->broadcast(p.tensor.detach(), 0);
    }
  }
  layout_ = FlatLayout::build(model_, n, options_.only_params);
  // The stage's policies (zero_policies.h) over the units.
  residency_ = std::make_unique<ParameterResidency>(layout_, dp_, options_, policies_.params, policies_.params_apart);
  gradients_ =
      std::make_unique<GradientReduction>(layout_, params, dp_, options_, policies_.grads, data_parallel_size());
  unit_of_param_.assign(params.size(), 0);
  const auto compute = options_.compute_dtype;
  std::vector<optim::Segment> segments;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const auto& fu = layout_.units[u];
    // The unit is packed on the CPU first, and only what this rank keeps is copied to the device
    // (a stage-3 unit's full buffer exists there only while its parameter views are made, below).
    // A separate fp32 master only for 16-bit compute, taken from the unrounded weights; in fp32
    // (or fp64), and with bf16 masters (optimizer.master_precision), the shard is the master.
    const bool separate_master = at::elementSize(compute) < 4 && adam.masters == optim::MasterRounding::None;
    at::Tensor packed = at::zeros({fu.padded_numel}, compute);
    at::Tensor master_full = separate_master ? at::zeros({fu.padded_numel}, at::kFloat) : at::Tensor();
    for (const auto& fp : fu.params) {
      unit_of_param_[fp.param_index] = u;
      const auto& src = params[fp.param_index].tensor.detach().reshape({-1});
      if (separate_master) master_full.narrow(0, fp.offset, fp.numel).copy_(src);
      packed.narrow(0, fp.offset, fp.numel).copy_(src);
    }
    residency_->add_unit(u, packed, params);  // the parameters are views of the unit from here on
    gradients_->add_unit(u);
    place_unit_states(u, packed, master_full, segments);
  }
  const int file_rank = dp_->rank() + (options_.replicas ? options_.replicas->rank() * dp_->size() : 0);
  start_states(adam, std::move(segments), file_rank);
  residency_->start(file_rank);
  segment_unscale_.assign(segment_unit_.size(), 1.0);
  gradients_->start();
  // Stages 2-3 reduce each unit as its gradients complete in every micro-step's backward; stage 1 in
  // the boundary micro-step's backward only (on_param_grad_ready), as DeepSpeed's stage 1 does.
  if (options_.stage >= 1) {
    for (size_t k = 0; k < params.size(); ++k)
      if (packs(k)) on_gradient_ready(params[k].tensor, [this, k] { on_param_grad_ready(k); }, accumulators_);
  }
}

ZeroEngine::~ZeroEngine() = default;

void ZeroEngine::before_unit(size_t u) { residency_->before_forward(u); }

at::Tensor ZeroEngine::after_unit(size_t u, const at::Tensor& output) {
  const bool backward_follows = at::GradMode::is_enabled();
  residency_->after_forward(u, backward_follows);
  if (!backward_follows) return output;
  at::Tensor out = output;
  // In backward: the re-gather (residency) runs first, then the backward signal moves from the scale
  // of the unit above to this unit's own.
  if (!unit_scales_.empty() && u + 1 < unit_scales_.size()) {
    const double factor = unit_scales_[u] / unit_scales_[u + 1];
    if (factor != 1.0) out = scale_gradient(out, factor);
  }
  return residency_->wrap_for_backward(u, out);
}

void ZeroEngine::prepare_backward(bool boundary) { gradients_->prepare_backward(boundary); }

void ZeroEngine::on_param_grad_ready(size_t param) {
  const size_t u = unit_of_param_[param];
  if (gradients_->gradient_arrived(param, u)) residency_->release(u);  // sharded: its gradients are reduced
  gradients_->poll();
}

void ZeroEngine::finish_gradient_sync(double loss_scale) {
  if (!gradients_->finish(loss_scale, unit_scales_)) return;
  for (size_t k = 0; k < segment_unit_.size(); ++k) segment_unscale_[k] = gradients_->unscale(segment_unit_[k]);
}

std::vector<UnitGradStats> ZeroEngine::unit_grad_stats() {
  // [non-finite flag, largest |gradient|] per unit, from this rank's shard, computed where the
  // gradients live and read back in one transfer; then MAX over ranks.
  const int64_t n = static_cast<int64_t>(units_.size());
  std::vector<at::Tensor> per_unit;
  for (int64_t u = 0; u < n; ++u) {
    const int64_t S = layout_.units[u].shard_numel;
    const auto g = gradients_->shard(u).to(at::kFloat);
    const auto largest = S > 0 ? g.abs().max() : at::zeros({}, g.options());
    per_unit.push_back(at::stack({at::isfinite(g).all().logical_not().to(at::kFloat), largest}));
  }
  const auto local = at::stack(per_unit).to(at::kCPU, at::kDouble);
  auto stats = at::zeros({2 * n}, at::kDouble);
  for (int64_t u = 0; u < n; ++u) {
    const bool finite = local[u][0].item<double>() == 0.0;
    stats[2 * u] = finite ? 0.0 : 1.0;
    stats[2 * u + 1] = finite ? local[u][1].item<double>() * gradients_->unscale(u) : 0.0;
  }
  dp_->all_reduce(stats, comm::ReduceOp::Max);
  std::vector<UnitGradStats> out(n);
  for (int64_t u = 0; u < n; ++u) out[u] = {stats[2 * u].item<double>() > 0, stats[2 * u + 1].item<double>()};
  return out;
}

at::Tensor ZeroEngine::unit_gradient_shard(size_t u) { return gradients_->shard(u); }

void ZeroEngine::skip_step() {
  gradients_->zero();
  ++steps_seen_;
}

double ZeroEngine::grad_sum_of_squares() {
  // Each segment's norm is computed where the gradients live; one transfer brings them all back,
  // and the sum of squares is taken in double on the host.
  std::vector<at::Tensor> norms;
  for (const auto& g : segment_grads_) norms.push_back((g.scalar_type() == at::kDouble ? g : g.to(at::kFloat)).norm());
  double local = 0;
  if (!norms.empty()) {
    const auto host = at::stack(norms).to(at::kCPU, at::kDouble);
    const double* v = host.data_ptr<double>();
    for (size_t k = 0; k < segment_grads_.size(); ++k) {
      const double n = v[k] * segment_unscale_[k];
      local += n * n * (options_.grad_norm_weights.empty() ? 1.0 : options_.grad_norm_weights[segment_param_[k]]);
    }
  }
  auto total = at::tensor({local}, at::kDouble);
  if (options_.stage > 0) dp_->all_reduce(total);  // stage 0: every rank holds all of it
  return total.item<double>();
}

void ZeroEngine::step(double grad_norm, double max_norm, double lr) {
  at::NoGradGuard no_grad;
  const comm::FlightContext label("optimizer step");
  optim::clip_grads(segment_grads_, grad_norm, max_norm);  // on the device, before any copy down
  // Apart: no copy up (or file read) of a unit prefetched but never gathered may still read a host shard
  // (or its file) that the step rewrites. (The rules of stage3_schedule.h leave none; the safeguard.)
  if (residency_->apart()) residency_->release_all();
  if (offload_ || files()) page_out_states(/*write=*/true);  // a view that paged them in and kept them
  step_states(lr);
  // Stage 3: a unit still gathered now would hold the values from before this update; release it,
  // so the next use gathers the updated shards. (The rules of stage3_schedule.h release every unit
  // by the end of backward; this is the safeguard.)
  residency_->release_all();
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& st = units_[u];
    const auto& shard = residency_->shard(u);
    const bool on_disk = files() && files()->offloaded(u);  // written by the step itself
    if (!offload_ && !host_optimizer_ && !on_disk && !st->master.is_same(shard)) shard.copy_(st->master);
  }
  gradients_->zero();
  residency_->refresh();
  ++steps_seen_;
}

std::vector<std::pair<std::string, at::Tensor>> ZeroEngine::gather_full_parameters() {
  // Offloaded fp32 masters: read them in for this, and drop them again after (unchanged).
  const bool paging = offload_ && masters_offloaded_ && !offload_->paged_in();
  if (paging) page_in_states();
  // Offloaded shards that are the masters (fp32, bf16 masters; apart, the host optimizer's): read them in
  // too, and drop them after.
  bool paging_params = false;
  for (size_t u = 0; u < units_.size() && files() && !residency_->paged_in(); ++u)
    paging_params = paging_params || (files()->offloaded(u) && shard_is_master(u));
  if (paging_params)
    for (size_t u = 0; u < units_.size(); ++u) files()->page_in(u, /*read=*/true);
  std::vector<std::pair<std::string, at::Tensor>> out(model_.parameters().size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& fu = layout_.units[u];
    // fp32 (fp64 in exactness tests); apart, from host memory through the device (a GPU communicator
    // moves device memory only).
    const auto master = apart_ ? units_[u]->master.to(options_.device, false, /*copy=*/true) : units_[u]->master;
    auto full = at::empty({fu.padded_numel}, master.options());
    if (options_.stage == 0) full.copy_(master);
    else dp_->all_gather(master.contiguous(), full);
    for (const auto& fp : fu.params)
      out[fp.param_index] = {fp.name, full.narrow(0, fp.offset, fp.numel).view(fp.shape).to(at::kCPU, false, /*copy=*/true)};
  }
  if (paging) page_out_states(/*write=*/false);
  if (paging_params) {
    files()->finish(/*write=*/false);
    ParamOffload::release_cached_blocks();
    StateOffload::return_freed_memory();
  }
  return out;
}

void ZeroEngine::masters_loaded(int64_t optimizer_steps, int64_t steps) {
  at::NoGradGuard no_grad;
  residency_->release_all();
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& master = units_[u]->master;
    if (master.defined() && !master.is_same(residency_->shard(u))) residency_->shard(u).copy_(master);
  }
  residency_->refresh();
  adam_->set_steps_taken(optimizer_steps);
  steps_seen_ = steps;
  page_out_states(/*write=*/true);  // loaded into paged-in memory (checkpoint_view): to the files
}

ZeroBytes ZeroEngine::element_bytes() const {
  return {static_cast<int64_t>(at::elementSize(options_.compute_dtype)),
          static_cast<int64_t>(at::elementSize(options_.grad_accum_dtype)),
          options_.compute_dtype == at::kDouble ? 8 : 4, adam_options_.state_precision, adam_options_.min_8bit_size,
          adam_options_.masters};
}

ZeroMemory ZeroEngine::memory() const {
  auto m = policy_memory(layout_, policies_, element_bytes(), options_.persistence_threshold,
                         options_.offload_param_max_in_cpu);  // the planner's sum too (zero_policies.h)
  m.gathered_peak = residency_->gathered_peak();
  if (offload_) states_to_disk(m);  // on disk between steps (the planner moves the same bytes: plan/planner.cpp)
  return m;
}

// The buffers the constructor allocated, counted from the tensors themselves; they must equal
// zero_state_bytes (what memory() reports and the planner predicts).
void ZeroEngine::check_memory_formula() const {
  ZeroMemory held;
  int64_t host_buffers = 0;  // apart: masters and staging in host memory
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& st = *units_[u];
    const auto& fu = layout_.units[u];
    const auto &flat = residency_->flat(u), &shard = residency_->shard(u);
    const bool host_shard = residency_->host_shard(u), persistent = residency_->persistent(u);
    held.compute_params +=
        ((persistent ? flat.numel() : 0) + (options_.stage == 3 && !host_shard ? shard.numel() : 0)) *
        flat.element_size();
    if (host_shard) host_buffers += shard.numel() * shard.element_size();
    held.gradients += gradients_->held_bytes(u);
    const int64_t master = st.master.is_same(shard) ? 0 : st.master.numel() * st.master.element_size();
    if (apart_) {
      host_buffers += master;
      for (const auto* t : {&st.host_grad, &st.host_stage})
        if (t->defined()) host_buffers += t->numel() * t->element_size();
    } else {
      held.master_params += master;
    }
    held.padding_elements += fu.padded_numel - fu.numel;
    // The formula gives every rank a whole shard of Adam moments (rank 0's, the most any rank
    // holds); the padding that ends the last ranks' shards has none.
    // (8-bit: the formula counts each rank's own bytes, padding holds none.)
    const int64_t S = fu.shard_numel, lo = shard_index() * S;
    const int64_t real = std::clamp<int64_t>(fu.numel - lo, 0, S);
    const auto states = adam_options_.state_precision;
    if (states != optim::StatePrecision::Int8)
      held.optimizer_states += 2 * (S - real) * (states == optim::StatePrecision::BF16 ? 2 : element_bytes().master) +
                               (adam_options_.masters == optim::MasterRounding::Kahan ? 2 * (S - real) : 0);
  }
  held.optimizer_states += adam_->state_bytes();
  // The NVMe parameter shards are still here: their files come after this check (ParameterResidency::start).
  auto resident = policies_;
  resident.params_nvme = false;
  const auto formula = policy_memory(layout_, resident, element_bytes(), options_.persistence_threshold,
                                     options_.offload_param_max_in_cpu);
  const int64_t states = optimizer_state_bytes(layout_, element_bytes(), shard_index());  // this rank's
  held.host = host_buffers;
  if (apart_) {  // the moments are host memory too
    held.host += held.optimizer_states;
    held.optimizer_states = 0;
  }
  // NVMe apart: the masters and moments are still here, on their way to the files (formula: offloaded,
  // with the moments of the rank holding most; this rank's are `states`; its host line holds the host
  // parameter shards of parameter offload apart too). Parameter offload apart otherwise: the host shards.
  const int64_t most = zero_state_bytes(layout_, options_.stage, element_bytes(), options_.persistence_threshold)
                           .optimizer_states;
  const int64_t host =
      (!apart_                  ? 0
       : options_.offload_nvme ? formula.host + formula.offloaded - most + states
                               : host_optimizer_bytes(layout_, options_.stage, element_bytes(), states)) +
      (residency_->apart() ? parameter_shards_to_host(layout_, element_bytes(), options_.persistence_threshold, apart_).host
                     : 0);
  if (held.compute_params != formula.compute_params || held.gradients != formula.gradients ||
      held.master_params != formula.master_params || held.optimizer_states != (apart_ ? 0 : states) ||
      held.host != host)
    fail("internal: the ZeRO engine allocated ", held.total(), " bytes of model state (", held.host, " in host memory), "
         "its formula (shared with the planner) says ", formula.total(), " (", formula.host, "); "
         "parallel/zero/zero_memory.cpp and the engine disagree");
}

}  // namespace shardlm::parallel
