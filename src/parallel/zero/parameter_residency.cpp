// See parameter_residency.h.
#include "parallel/zero/parameter_residency.h"

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>

#include "comm/flight_recorder.h"
#include "model/weight_grad_deferral.h"
#include "parallel/zero/host_optimizer.h"
#include "parallel/zero/stage3_schedule.h"
#include "parallel/zero/state_offload.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

// Gives a tensor's storage `bytes` of fresh memory (0: frees it), keeping the tensor and every view
// of it valid: this is how a stage-3 unit exists only while gathered. On a GPU the memory comes
// from and goes back to the CUDA caching allocator, which hands the same blocks to the next
// gather (the communicator records its stream's use of them, so reuse waits for the collective).
void set_storage_bytes(const at::Tensor& t, size_t bytes) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  if (t.is_cpu()) {
    at::native::resize_bytes_cpu(storage, bytes);
    return;
  }
  const c10::DeviceGuard on_its_device(t.device());  // the allocator takes the current device
  storage->set_data_ptr_noswap(bytes > 0 ? storage->allocator()->allocate(bytes) : c10::DataPtr(nullptr, t.device()));
  storage->set_nbytes(bytes);
}

}  // namespace

// Identity in forward. In backward it runs right before the backward of the unit whose output it
// wraps: there it re-gathers that unit's parameters (stage 3) and prefetches the unit below.
struct PreBackwardHook : public torch::autograd::Function<PreBackwardHook> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t residency,
                            int64_t unit) {
    ctx->saved_data["residency"] = residency;
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* r = reinterpret_cast<ParameterResidency*>(ctx->saved_data["residency"].toInt());
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    if (model::WeightGradQueue::input_backward_running()) r->release_after_input_backward(unit);
    r->gather(unit);
    for (size_t other : r->layout_.units[unit].also_reads) r->gather(other);
    r->prefetch_after(unit, -1);
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

struct ParameterResidency::Unit {
  enum class Params { Released, Reading, InFlight, Ready };  // Reading: an NVMe shard's file read
  at::Tensor flat;   // compute dtype [padded]: the full unit (sharded: storage only while gathered)
  at::Tensor shard;  // compute dtype [S]: this rank's piece (a view of flat where replicated)
  Params params = Params::Ready;
  bool persistent = true;
  comm::WorkPtr gather_work;
  util::FileStore::Ticket read;  // NVMe: the shard's file into this rank's slot of flat
  at::Tensor bounce;             // NVMe apart from the device: the host buffer the file lands in
};

ParameterResidency::ParameterResidency(const FlatLayout& layout, comm::CommPtr dp, const ZeroOptions& options,
                                       ParamResidency how, bool apart)
    : layout_(layout), dp_(std::move(dp)), options_(options), how_(how), apart_(apart) {}

ParameterResidency::~ParameterResidency() = default;

bool ParameterResidency::persistent(size_t u) const { return units_[u]->persistent; }
const at::Tensor& ParameterResidency::flat(size_t u) const { return units_[u]->flat; }
const at::Tensor& ParameterResidency::shard(size_t u) const { return units_[u]->shard; }

void ParameterResidency::add_unit(size_t u, const at::Tensor& packed, std::vector<model::Parameter>& params) {
  if (u != units_.size()) fail("internal: ParameterResidency::add_unit out of order");
  const auto& fu = layout_.units[u];
  auto st = std::make_unique<Unit>();
  const int64_t S = fu.shard_numel, r = rank();
  const auto on_device = at::TensorOptions().device(options_.device);
  const bool replicated = how_ == ParamResidency::Replicated;
  st->persistent = replicated || !stage3_sharded(fu, options_.persistence_threshold);
  auto copy_to_device = [&](const at::Tensor& t) { return t.to(on_device.dtype(t.scalar_type()), false, /*copy=*/true); };
  if (st->persistent) {
    st->flat = options_.device.is_cpu() ? packed : copy_to_device(packed);
    st->shard = replicated ? st->flat.narrow(0, r * S, S) : st->flat.narrow(0, r * S, S).clone();
  } else {  // storage only for as long as it takes to make the parameters' views (below)
    st->flat = at::empty({fu.padded_numel}, on_device.dtype(options_.compute_dtype));
    st->shard = apart_ ? host_buffer(S, options_.compute_dtype, options_.device.is_cuda())
                                     .copy_(packed.narrow(0, r * S, S))
                               : copy_to_device(packed.narrow(0, r * S, S));
  }
  for (const auto& fp : fu.params)
    params[fp.param_index].tensor.set_data(st->flat.narrow(0, fp.offset, fp.numel).view(fp.shape));
  if (!st->persistent) {
    set_storage_bytes(st->flat, 0);
    st->params = Unit::Params::Released;
  }
  units_.push_back(std::move(st));
}

void ParameterResidency::start(int file_rank) {
  if (options_.offload_param_nvme) {
    if (how_ != ParamResidency::Sharded)
      fail("zero_optimization.offload_param.device \"nvme\" needs ZeRO stage 3 (DeepSpeed offloads parameters only at "
           "stage 3); set zero_optimization.stage to 3, or zero_optimization.offload_param.device to \"none\"");
    if (!options_.device.is_cpu() && !apart_)
      fail("internal: NVMe parameter offload on a GPU needs the host shards apart (ZeroOptions::offload_param_apart)");
    const auto off = stage3_offloaded_units(layout_, options_.persistence_threshold, options_.offload_param_max_in_cpu);
    std::vector<at::Tensor> shards(units_.size());
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!off[u]) continue;
      const int64_t S = layout_.units[u].shard_numel;
      if (static_cast<double>(S) > options_.offload_param_buffer_numel)
        fail("zero_optimization.offload_param.buffer_size = ", options_.offload_param_buffer_numel, " elements is ",
             "smaller than the shard of unit ", layout_.units[u].name, " (", S, " elements); set it to at least ", S,
             " (as in DeepSpeed, every parameter shard must fit one buffer)");
      shards[u] = units_[u]->shard;
    }
    ParamOffloadOptions po;
    po.dir = options_.offload_param_path;
    po.buffer_count = options_.offload_param_buffer_count;
    po.rank = file_rank;
    po.name = options_.offload_param_files;
    files_ = std::make_unique<ParamOffload>(std::move(shards), po);
    StateOffload::return_freed_memory();
  }
  if (apart_) uploads_ = make_shard_uploads(options_.device);
  // The backward of the last unit (a pipeline stage's own last) gathers it and prefetches the units
  // below it, up to prefetch_numel elements, when the activations, and so the memory in use, peak.
  // Those units, kept gathered from their forward to their backward instead, are not gathered twice.
  // (DeepSpeed's stage3_max_reuse_distance, measured in the window the engine already gathers.)
  kept_for_backward_.assign(units_.size(), 0);
  if (!units_.empty()) complete_at_ = stage3_gradients_complete_at(layout_, 0, units_.size() - 1);
  if (how_ == ParamResidency::Sharded)
    kept_for_backward_ =
        stage3_units_kept_for_backward(layout_, options_.prefetch_numel, options_.persistence_threshold);
}

void ParameterResidency::start_gather(size_t u) {
  auto& st = *units_[u];
  if (st.params != Unit::Params::Released) return;
  const size_t bytes = layout_.units[u].padded_numel * st.flat.element_size();
  const bool read = files_ && files_->offloaded(u);
  const bool upload = apart_ && !st.persistent;  // the host shard (or its file) up into the slot
  if (read && !upload) ParamOffload::set_aligned_storage(st.flat, bytes, /*zeroed=*/false);  // O_DIRECT reads in
  else set_storage_bytes(st.flat, bytes);
  gathered_now_ += bytes;
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  if (read || upload) {  // the file or the copy up first; launch_read_gathers gathers in place
    const int64_t S = layout_.units[u].shard_numel;
    const auto slot = st.flat.narrow(0, rank() * S, S);
    if (read && upload) {  // the file into a host bounce buffer; up from there once it landed
      st.bounce = host_buffer(S, st.flat.scalar_type(), options_.device.is_cuda());
      if (options_.device.is_cpu()) ParamOffload::set_aligned_storage(st.bounce, st.bounce.nbytes(), false);
      st.read = files_->read_into(u, st.bounce.data_ptr());
    } else if (read) {
      st.read = files_->read_into(u, slot.data_ptr());
    } else {
      uploads_->start(u, slot, st.shard);
    }
    st.params = Unit::Params::Reading;
    reading_.push_back(u);
    return;
  }
  const comm::FlightContext label([&] { return "gather " + layout_.units[u].name; });  // names the call in flight records
  st.gather_work = dp_->all_gather_async(st.shard, st.flat);
  st.params = Unit::Params::InFlight;
}

// NVMe: the all-gathers of the units whose files were being read, in the order the reads started, up
// to `upto`. Every rank makes the same calls in the same order, so the collectives match whatever
// the disk does; each waits for its own read only.
void ParameterResidency::launch_read_gathers(size_t upto) {
  size_t k = 0;
  while (k < reading_.size()) {
    const size_t v = reading_[k++];
    auto& sv = *units_[v];
    sv.read.wait();
    const int64_t S = layout_.units[v].shard_numel;
    if (sv.bounce.defined()) uploads_->start(v, sv.flat.narrow(0, rank() * S, S), sv.bounce);
    if (uploads_) uploads_->wait(v);
    sv.bounce = at::Tensor();  // a GPU's pinned block is reused only once its copy ran (the host allocator's event)
    const comm::FlightContext label([&] { return "gather " + layout_.units[v].name; });
    sv.gather_work = dp_->all_gather_async(sv.flat.narrow(0, rank() * S, S), sv.flat);
    sv.params = Unit::Params::InFlight;
    if (v == upto) break;
  }
  reading_.erase(reading_.begin(), reading_.begin() + static_cast<std::ptrdiff_t>(k));
}

void ParameterResidency::gather(size_t u) {
  auto& st = *units_[u];
  start_gather(u);
  if (st.params == Unit::Params::Reading) launch_read_gathers(u);
  if (st.params == Unit::Params::InFlight) {
    st.gather_work->wait();  // never read a half-arrived buffer
    st.gather_work.reset();
    st.params = Unit::Params::Ready;
  }
}

void ParameterResidency::release(size_t u) {
  auto& st = *units_[u];
  if (st.persistent || st.params == Unit::Params::Released) return;
  if (st.params == Unit::Params::Reading) {  // read ahead, never gathered (alike on every rank)
    st.read.wait();
    if (uploads_) uploads_->wait(u);  // the slot is freed on the compute stream: after the copy into it
    st.bounce = at::Tensor();
    reading_.erase(std::find(reading_.begin(), reading_.end(), u));
  }
  if (st.gather_work) {  // a prefetch still writing into the buffer
    st.gather_work->wait();
    st.gather_work.reset();
  }
  set_storage_bytes(st.flat, 0);
  gathered_now_ -= layout_.units[u].padded_numel * st.flat.element_size();
  st.params = Unit::Params::Released;
}

void ParameterResidency::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

void ParameterResidency::prefetch_after(size_t u, int direction) {
  if (how_ != ParamResidency::Sharded) return;
  // NVMe: the oldest read, started at an earlier unit, has had its compute to land: gather it now (one
  // per hook, so a wide window does not wait here for all of its reads), then start reading the rest
  // of this window. Without offload every start gathers at once.
  if (!reading_.empty()) launch_read_gathers(reading_.front());
  for (size_t v : stage3_prefetch_window(layout_, u, direction, options_.prefetch_numel, options_.persistence_threshold))
    start_gather(v);  // no-op where already gathered or in flight
}

// zb_h1's B (model/weight_grad_deferral.h) computes only input gradients and fires no gradient hook, so
// the gradient hook, which releases a unit once its gradients arrived, runs only in W. Parameters are
// needed only by B (dX = dY·W; W's dW = dYᵀ·X reads none), so when B reaches unit u, every unit above
// it whose gradients would be complete by now is released: the moment a whole backward releases it
// (stage3_schedule.h), so B gathers no more at once than a backward does.
void ParameterResidency::release_after_input_backward(size_t u) {
  for (size_t v = u + 1; v < units_.size(); ++v)
    if (complete_at_[v] > u) release(v);
}

void ParameterResidency::before_forward(size_t u) {
  gather(u);
  for (size_t other : layout_.units[u].also_reads) gather(other);
  prefetch_after(u, +1);
}

void ParameterResidency::after_forward(size_t u, bool backward_follows) {
  if (backward_follows && kept_for_backward_[u]) return;
  release(u);
  for (size_t other : layout_.units[u].also_reads) release(other);
}

at::Tensor ParameterResidency::wrap_for_backward(size_t u, const at::Tensor& output) {
  if (how_ != ParamResidency::Sharded) return output;
  return PreBackwardHook::apply(output, reinterpret_cast<int64_t>(this), static_cast<int64_t>(u));
}

// Full compute parameters where they persist (every replicated unit, stage 3's small ones) from the
// updated shards, in allgather_bucket_size buckets (zero_gather_buckets.h). Whole units are their shard.
void ParameterResidency::refresh() {
  if (options_.stage == 0) return;
  if (!ag_buckets_) {
    std::vector<int64_t> shard_numel;
    for (size_t u = 0; u < units_.size(); ++u)
      shard_numel.push_back(units_[u]->persistent ? layout_.units[u].shard_numel : 0);
    ag_buckets_ = std::make_unique<AllGatherBuckets>(std::move(shard_numel), options_.allgather_bucket_numel, dp_);
  }
  std::vector<at::Tensor> shards, flats;
  for (auto& st : units_) {
    shards.push_back(st->shard);
    flats.push_back(st->flat);
  }
  ag_buckets_->gather(shards, flats);
}

void ParameterResidency::page_in_all() {
  if (!files_ || paged_in_) return;
  for (size_t u = 0; u < units_.size(); ++u) files_->page_in(u, /*read=*/true);
  paged_in_ = true;
}

void ParameterResidency::page_out_all(bool write) {
  if (!paged_in_) return;
  files_->finish(write);
  paged_in_ = false;
  ParamOffload::release_cached_blocks();
  StateOffload::return_freed_memory();
}

}  // namespace shardlm::parallel
