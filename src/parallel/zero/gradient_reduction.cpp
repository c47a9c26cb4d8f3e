// See gradient_reduction.h.
#include "parallel/zero/gradient_reduction.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "comm/flight_recorder.h"
#include "util/error.h"

namespace shardlm::parallel {

struct GradientReduction::Unit {
  at::Tensor grad_flat;   // full compute-dtype gradients, the parameters' .grad views (stages 0-1)
  at::Tensor grad_shard;  // persistent reduced gradients [S] (stages 2-3)
  size_t grads_pending = 0;
  at::Tensor rs_send, rs_recv;  // in-flight reduce-scatter buffers
  comm::WorkPtr rs_work;
  bool rs_launched = false;  // stage 1: this boundary's reduce-scatter of the unit has started
};

GradientReduction::GradientReduction(const FlatLayout& layout, std::vector<model::Parameter>& params,
                                     comm::CommPtr dp, const ZeroOptions& options, GradReduction how, int average_over)
    : layout_(layout), params_(params), dp_(std::move(dp)), options_(options), how_(how), average_over_(average_over) {}

GradientReduction::~GradientReduction() = default;

void GradientReduction::add_unit(size_t u) {
  if (u != units_.size()) fail("internal: GradientReduction::add_unit out of order");
  const auto& fu = layout_.units[u];
  const auto on_device = at::TensorOptions().device(options_.device);
  auto st = std::make_unique<Unit>();
  if (keeps_full()) {
    st->grad_flat = at::zeros({fu.padded_numel}, on_device.dtype(options_.compute_dtype));
    for (const auto& fp : fu.params)
      params_[fp.param_index].tensor.mutable_grad() = st->grad_flat.narrow(0, fp.offset, fp.numel).view(fp.shape);
  } else {
    st->grad_shard = at::zeros({fu.shard_numel}, on_device.dtype(options_.grad_accum_dtype));
  }
  units_.push_back(std::move(st));
}

void GradientReduction::start() {
  unit_unscale_.assign(units_.size(), 1.0);
  buckets_ = make_buckets();
}

at::Tensor GradientReduction::shard(size_t u) const {
  const int64_t S = layout_.units[u].shard_numel;
  return keeps_full() ? units_[u]->grad_flat.narrow(0, shard_index() * S, S) : units_[u]->grad_shard;
}

int64_t GradientReduction::held_bytes(size_t u) const {
  const auto& t = keeps_full() ? units_[u]->grad_flat : units_[u]->grad_shard;
  return t.numel() * t.element_size();
}

// Reduce-scatter buckets (zero_buckets.h) on more than one rank, unless reduce_bucket_size is 0 (unit
// by unit, as before buckets existed: for comparisons).
std::unique_ptr<ReduceScatterBuckets> GradientReduction::make_buckets() {
  if (how_ == GradReduction::AllReduceAtBoundary || dp_->size() == 1 || options_.reduce_bucket_numel <= 0)
    return nullptr;
  std::vector<int64_t> shard_numel;
  for (const auto& fu : layout_.units) shard_numel.push_back(fu.shard_numel);
  const int64_t r = shard_index();
  auto deliver = [this, r](size_t u, const at::Tensor& reduced) {
    auto& st = *units_[u];
    if (keeps_full()) st.grad_flat.narrow(0, r * reduced.numel(), reduced.numel()).copy_(reduced);
    else st.grad_shard.add_(reduced.to(st.grad_shard.scalar_type()));
  };
  // A bucket never outgrows the largest unit: it then launches as soon as a unit's worth of
  // gradients is in, during backward, while its data is still in cache, and it holds no more memory
  // than the unit-by-unit path did. Only units smaller than that coalesce. DeepSpeed's default cap
  // (5e8 elements) exceeds most models whole: a single bucket, reduced after backward, copied
  // cache-cold (measured on the demo model: stage 3 ~4% slower than unit by unit).
  const int64_t cap = std::min(options_.reduce_bucket_numel, layout_.largest_unit_numel());
  return std::make_unique<ReduceScatterBuckets>(
      std::move(shard_numel), cap, dp_,
      at::TensorOptions().device(options_.device).dtype(options_.compute_dtype), std::move(deliver));
}

void GradientReduction::prepare_backward(bool boundary) {
  // A bucket holding a unit this backward never reached (a pipeline stage's unused units) is
  // reduced now, with zeros for that unit, before the next backward fills its buffer again.
  if (buckets_) buckets_->flush();
  sync_ = boundary;
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->grads_pending = layout_.units[u].params.size();
}

bool GradientReduction::gradient_arrived(size_t param, size_t u) {
  auto& st = *units_[u];
  if (st.grads_pending == 0) fail("ZeRO: gradient of parameter ", param, " arrived twice in one backward");
  if (--st.grads_pending != 0) return false;
  if (how_ == GradReduction::ReduceScatterEveryMicroStep) reduce_unit(u);
  else if (sync_) start_boundary_reduction(u);  // stage 1 accumulates full gradients until the boundary's backward
  return true;
}

// Hands landed reductions over (stage 1 unit by unit waits for its own at finish).
void GradientReduction::poll() {
  if (how_ == GradReduction::ReduceScatterEveryMicroStep || buckets_) complete_reductions(false);
}

// Stage 1, in the boundary micro-step's backward (or at finish for a unit whose gradients never
// completed there): unit u's accumulated full gradient starts its reduce-scatter, so it overlaps the
// rest of the backward. This rank's reduced piece lands in its own region of grad_flat (the bucket's
// deliver, or finish from rs_recv), where the optimizer segments point. The collectives and their
// sizes are those the boundary would issue, so the results are the same bits.
void GradientReduction::start_boundary_reduction(size_t u) {
  auto& st = *units_[u];
  if (st.rs_launched) return;
  st.rs_launched = true;
  const comm::FlightContext label("reduce-scatter " + layout_.units[u].name);
  if (buckets_) {
    buckets_->send_rows(u).copy_(st.grad_flat.view({dp_->size(), layout_.units[u].shard_numel}));
    buckets_->unit_ready(u);
  } else {
    st.rs_recv = at::empty({layout_.units[u].shard_numel}, st.grad_flat.options());
    st.rs_work = dp_->reduce_scatter_async(st.grad_flat, st.rs_recv);
  }
  if (!options_.overlap_comm) {
    if (buckets_) buckets_->complete(true);
    else if (st.rs_work) st.rs_work->wait();
  }
}

void GradientReduction::reduce_unit(size_t u) {
  const comm::FlightContext label([&] { return "reduce-scatter " + layout_.units[u].name; });
  if (buckets_) return reduce_unit_into_bucket(u);
  auto& st = *units_[u];
  const auto& fu = layout_.units[u];
  complete_reductions(false);
  if (st.rs_work) {  // the previous micro-step's reduction of this unit must land first
    st.rs_work->wait();
    complete_reductions(false);
  }
  const auto buffer = at::TensorOptions().device(options_.device).dtype(options_.compute_dtype);
  st.rs_send = at::empty({fu.padded_numel}, buffer);
  st.rs_send.narrow(0, fu.numel, fu.padded_numel - fu.numel).zero_();  // parameters fill the rest below
  for (const auto& fp : fu.params) {
    auto& g = params_[fp.param_index].tensor.mutable_grad();
    st.rs_send.narrow(0, fp.offset, fp.numel).copy_(g.reshape({-1}));
    g = at::Tensor();  // release the full gradient: only the shard persists
  }
  st.rs_recv = at::empty({fu.shard_numel}, buffer);
  st.rs_work = dp_->reduce_scatter_async(st.rs_send, st.rs_recv);
  if (!options_.overlap_comm) complete_reductions(true);
}

void GradientReduction::reduce_unit_into_bucket(size_t u) {
  const auto& fu = layout_.units[u];
  const int64_t S = fu.shard_numel, n = dp_->size();
  auto rows = buckets_->send_rows(u);  // [n, S]: row p receives elements [p·S, (p+1)·S) of the unit
  // Writes `len` elements starting at unit offset `at` (from src, or zeros) into the rows.
  auto put = [&](int64_t at, int64_t len, const at::Tensor* src) {
    for (int64_t p = std::max<int64_t>(0, at / S); p < n && p * S < at + len; ++p) {
      const int64_t lo = std::max(at, p * S), hi = std::min(at + len, (p + 1) * S);
      if (lo >= hi) continue;
      auto dst = rows[p].narrow(0, lo - p * S, hi - lo);
      if (src) dst.copy_(src->narrow(0, lo - at, hi - lo));
      else dst.zero_();
    }
  };
  for (const auto& fp : fu.params) {
    auto& g = params_[fp.param_index].tensor.mutable_grad();
    const auto flat = g.reshape({-1});
    put(fp.offset, fp.numel, &flat);
    g = at::Tensor();  // release the full gradient: only the shard persists
  }
  put(fu.numel, fu.padded_numel - fu.numel, nullptr);
  buckets_->unit_ready(u);
  if (!options_.overlap_comm) complete_reductions(true);
}

void GradientReduction::complete_reductions(bool all) {
  if (buckets_) return buckets_->complete(all);
  for (auto& stp : units_) {
    auto& st = *stp;
    if (!st.rs_work) continue;
    if (all) st.rs_work->wait();
    else if (!st.rs_work->test()) continue;
    st.grad_shard.add_(st.rs_recv.to(st.grad_shard.scalar_type()));
    st.rs_work.reset();
    st.rs_send = at::Tensor();
    st.rs_recv = at::Tensor();
  }
}

bool GradientReduction::finish(double loss_scale, const std::vector<double>& unit_scales) {
  if (!sync_) return false;
  const comm::FlightContext label("gradient sync");
  std::vector<double> inv(units_.size());
  for (size_t u = 0; u < units_.size(); ++u)
    inv[u] = 1.0 / (average_over_ * (unit_scales.empty() ? loss_scale : unit_scales[u]));
  if (keeps_full()) finish_full(inv);
  else finish_shards(inv);
  sync_ = false;
  return true;
}

// Stage 1: every unit's full gradient was reduce-scattered during the boundary's backward
// (start_boundary_reduction); a unit whose gradients never completed there (not used by this
// micro-step's forward) starts now. This rank's reduced piece lands in its own region of the (no
// longer needed) full buffer, where the optimizer segments point. Stage 0: all-reduce it in place
// (every rank owns the whole unit).
void GradientReduction::finish_full(const std::vector<double>& inv) {
  const bool all_reduce = how_ == GradReduction::AllReduceAtBoundary;
  std::vector<comm::WorkPtr> works;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (all_reduce) works.push_back(dp_->all_reduce_async(units_[u]->grad_flat));
    else start_boundary_reduction(u);
  }
  if (buckets_ && !all_reduce) buckets_->flush();
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& st = *units_[u];
    if (all_reduce) works[u]->wait();
    auto mine = shard(u);
    if (st.rs_work) {
      st.rs_work->wait();
      mine.copy_(st.rs_recv);
      st.rs_work.reset();
      st.rs_recv = at::Tensor();
    }
    st.rs_launched = false;
    if (options_.replicas) options_.replicas->all_reduce(mine);  // hybrid: the other shard groups' sums
    // fp16 cannot hold unscaled small gradients: keep them scaled, unscale in fp32 when read.
    if (options_.compute_dtype == at::kHalf) unit_unscale_[u] = inv[u];
    else mine.mul_(inv[u]);
  }
}

void GradientReduction::finish_shards(const std::vector<double>& inv) {
  if (buckets_) buckets_->flush();
  complete_reductions(true);
  if (options_.replicas) {  // hybrid: add the other shard groups' sums, all units in flight at once
    std::vector<comm::WorkPtr> works;
    for (auto& st : units_) works.push_back(options_.replicas->all_reduce_async(st->grad_shard));
    for (auto& w : works) w->wait();
  }
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->grad_shard.mul_(inv[u]);
}

void GradientReduction::zero() {
  for (auto& st : units_) {
    if (keeps_full()) st->grad_flat.zero_();
    else st->grad_shard.zero_();
  }
}

}  // namespace shardlm::parallel
