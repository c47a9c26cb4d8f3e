#include "parallel/zero/zero_engine.h"

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <cstdlib>
#include <string>
#include <cmath>

#include "comm/flight_recorder.h"
#include "model/weight_grad_deferral.h"
#include "parallel/grad_ready_hook.h"
#include "parallel/scale_gradient.h"
#include "parallel/zero/stage3_schedule.h"
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
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t engine,
                            int64_t unit) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* engine = reinterpret_cast<ZeroEngine*>(ctx->saved_data["engine"].toInt());
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    if (model::WeightGradQueue::input_backward_running()) engine->release_after_input_backward(unit);
    engine->gather(unit);
    for (size_t other : engine->layout_.units[unit].also_reads) engine->gather(other);
    engine->prefetch_after(unit, -1);
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

struct ZeroEngine::UnitState {
  enum class Params { Released, Reading, InFlight, Ready };  // Reading: parameter offload's file read
  at::Tensor flat;        // compute dtype [padded]: the full unit (stage 3: storage only while gathered)
  at::Tensor shard;       // compute dtype [S]: this rank's piece (a view of flat below stage 3)
  at::Tensor master;      // fp32 [S]; the shard itself in fp32 and with bf16 masters (apart: a host parameter shard)
  at::Tensor grad_flat;   // stage 1: full compute-dtype gradients, the parameters' .grad views
  at::Tensor grad_shard;  // stages 2/3: persistent reduced gradients [S]
  // Host buffers apart from the device (offload_optimizer cpu on a GPU): the reduced gradient shard's
  // copy [S], and (16-bit compute) the cast parameters waiting for their copy up [S].
  at::Tensor host_grad, host_stage;
  Params params = Params::Ready;
  bool persistent = true;
  comm::WorkPtr gather_work;
  util::FileStore::Ticket read;  // parameter offload: the shard's file into this rank's slot of flat
  at::Tensor bounce;             // parameter offload apart from the device: the host buffer the file lands in
  size_t grads_pending = 0;
  at::Tensor rs_send, rs_recv;  // in-flight reduce-scatter buffers
  comm::WorkPtr rs_work;
  bool rs_launched = false;  // stage 1: this boundary's reduce-scatter of the unit has started
};

ZeroEngine::ZeroEngine(model::Llama& model, comm::CommPtr dp, ZeroOptions options, optim::AdamWOptions adam)
    : model_(model), dp_(std::move(dp)), options_(options), adam_options_(adam) {
  if (options_.stage < 0 || options_.stage > 3) fail("zero_optimization.stage must be 0, 1, 2 or 3");
  if (options_.replicas && options_.stage == 0)
    fail("hybrid sharding needs ZeRO stage 1, 2 or 3 (stage 0 shards nothing); set zero_optimization.stage");
  if (options_.per_unit_loss_scaling && model.config().tie_word_embeddings)
    fail("fp16.per_unit_loss_scaling with tie_word_embeddings: the shared embedding would collect gradients at two "
         "different scales; untie the embeddings or use one loss scale");
  const int n = shards(), r = shard_index();
  auto& params = model_.parameters();
  apart_ = (options_.offload_cpu || options_.offload_nvme) && (options_.host_buffers_apart || !options_.device.is_cpu());
  const bool pinned = apart_ && options_.device.is_cuda();
  params_apart_ = options_.offload_param_apart && options_.stage == 3;
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
  unit_of_param_.assign(params.size(), 0);
  const auto compute = options_.compute_dtype;
  const auto on_device = at::TensorOptions().device(options_.device);
  std::vector<optim::Segment> segments;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const auto& fu = layout_.units[u];
    auto st = std::make_unique<UnitState>();
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
    const int64_t S = fu.shard_numel;
    st->persistent = options_.stage < 3 || !stage3_sharded(fu, options_.persistence_threshold);
    auto copy_to_device = [&](const at::Tensor& t) { return t.to(on_device.dtype(t.scalar_type()), false, /*copy=*/true); };
    if (st->persistent) {
      st->flat = options_.device.is_cpu() ? packed : copy_to_device(packed);
      st->shard = options_.stage < 3 ? st->flat.narrow(0, r * S, S) : st->flat.narrow(0, r * S, S).clone();
    } else {  // storage only for as long as it takes to make the parameters' views (below)
      st->flat = at::empty({fu.padded_numel}, on_device.dtype(compute));
      st->shard = params_apart_ ? host_buffer(S, compute, options_.device.is_cuda()).copy_(packed.narrow(0, r * S, S))
                                : copy_to_device(packed.narrow(0, r * S, S));
    }
    const bool host_shard = params_apart_ && !st->persistent;
    if (apart_) {  // host memory only, for the host optimizer (its segments below are views of these)
      // Pinned where a copy reads or writes it: the gradients, the cast parameters, and a master that
      // goes up itself (fp32 compute); a 16-bit run's fp32 master and the moments never move. NVMe: the
      // master goes to the files, and every run's parameters go up from a staging buffer.
      const auto from = separate_master ? master_full.narrow(0, r * S, S) : packed.narrow(0, r * S, S);
      if (host_shard && !separate_master && !options_.offload_nvme) {
        // A host shard (parameter offload apart) of the master's dtype and values (fp32 compute, bf16
        // masters) is the master: one buffer, as the shard is in place on a CPU run; NVMe parameters
        // page it through their files, so the master lives there between steps.
        st->master = st->shard;
      } else {
        st->master = host_buffer(S, from.scalar_type(), pinned && !separate_master && !options_.offload_nvme);
        st->master.copy_(from);
      }
      const auto grad_dtype = options_.stage <= 1 ? compute : options_.grad_accum_dtype;
      st->host_grad = host_buffer(S, grad_dtype, pinned).zero_();
      // NVMe: every run's parameters go up from a staging buffer; a host shard (parameter offload) is its own.
      if ((separate_master || options_.offload_nvme) && !host_shard) st->host_stage = host_buffer(S, compute, pinned);
    } else if (host_shard) {  // the masters stay on the device (fp32 too: the shard is host memory now)
      st->master = copy_to_device(separate_master ? master_full.narrow(0, r * S, S) : packed.narrow(0, r * S, S));
    } else {
      st->master = separate_master ? copy_to_device(master_full.narrow(0, r * S, S)) : st->shard;
    }
    for (const auto& fp : fu.params) {
      auto& p = params[fp.param_index].tensor;
      p.set_data(st->flat.narrow(0, fp.offset, fp.numel).view(fp.shape));
    }
    if (!st->persistent) {
      set_storage_bytes(st->flat, 0);
      st->params = UnitState::Params::Released;
    }
    if (options_.stage <= 1) {
      st->grad_flat = at::zeros({fu.padded_numel}, on_device.dtype(compute));
      for (const auto& fp : fu.params)
        params[fp.param_index].tensor.mutable_grad() = st->grad_flat.narrow(0, fp.offset, fp.numel).view(fp.shape);
    } else {
      st->grad_shard = at::zeros({S}, on_device.dtype(options_.grad_accum_dtype));
    }
    // AdamW segments: the pieces of each parameter that fall in this rank's shard.
    for (const auto& fp : fu.params) {
      const int64_t lo = std::max(fp.offset, r * S), hi = std::min(fp.offset + fp.numel, (r + 1) * S);
      if (lo >= hi) continue;
      const auto grad = gradient_shard_of(*st, S).narrow(0, lo - r * S, hi - lo);
      segment_grads_.push_back(grad);
      const int64_t first = options_.first_element.empty() ? 0 : options_.first_element[fp.param_index];
      segments.push_back({fp.name + "@" + std::to_string(first + lo - fp.offset), st->master.narrow(0, lo - r * S, hi - lo),
                          apart_ ? st->host_grad.narrow(0, lo - r * S, hi - lo) : grad, fp.decay, lo - fp.offset,
                          fp.numel, first + lo - fp.offset});
      segment_unit_.push_back(u);
      segment_param_.push_back(fp.param_index);
      segment_shard_offset_.push_back(lo - r * S);
    }
    units_.push_back(std::move(st));
  }
  // bf16 masters: the bf16 shard is the master (apart from the device: its bf16 host copy, which the host
  // optimizer steps and the NVMe files page with Kahan's compensation beside the moments; NVMe parameter
  // offload in place pages the shard, the master, as it pages fp32 compute's). Parameter shards apart from
  // the device (a GPU's offload_param) are the host optimizer's masters themselves; NVMe states would page
  // a second copy of them, and without optimizer offload the masters would be the device's.
  if (adam.masters != optim::MasterRounding::None && compute != at::kBFloat16)
    fail("optimizer.master_precision \"bf16\" needs bf16 compute; set bf16.enabled, or optimizer.master_precision ",
         "\"fp32\"");
  if (adam.masters != optim::MasterRounding::None && params_apart_ && !options_.offload_cpu)
    fail("optimizer.master_precision \"bf16\" with parameter shards apart from the device (a GPU's ",
         "zero_optimization.offload_param) needs zero_optimization.offload_optimizer.device \"cpu\": the host shards ",
         "are then its bf16 masters (NVMe states would page a second copy of them); set offload_optimizer.device to ",
         "\"cpu\", offload_param.device to \"none\", or optimizer.master_precision to \"fp32\"");
  adam_ = std::make_unique<optim::AdamW>(std::move(segments), adam);
  share_cut_quantization_blocks();
  check_memory_formula();
  separate_master_ = at::elementSize(compute) < 4 && adam.masters == optim::MasterRounding::None;
  const int file_rank = dp_->rank() + (options_.replicas ? options_.replicas->rank() * dp_->size() : 0);
  if (options_.offload_nvme) {
    if (options_.stage == 0)
      fail("zero_optimization.offload_optimizer.device \"nvme\" needs ZeRO stage 1, 2 or 3 (DeepSpeed offloads only "
           "under ZeRO); set zero_optimization.stage to 1, 2 or 3");
    StateOffloadOptions so;
    so.dir = options_.offload_nvme_path;
    so.buffer_count = options_.offload_buffer_count;
    so.chunk_elements = options_.offload_chunk_elements;
    so.rank = file_rank;
    so.name = options_.offload_files;
    masters_offloaded_ = separate_master_ || apart_;  // apart, the host master is never the device's shard
    offload_ = std::make_unique<StateOffload>(*adam_, masters_offloaded_, so);
    if (masters_offloaded_)
      for (auto& st : units_) st->master = at::Tensor();  // on disk now; the optimizer dropped its views
    StateOffload::return_freed_memory();
    if (apart_) {  // the gradients come down and the parameters go up chunk by chunk, as the files stream
      std::vector<at::Tensor> grads, stages;
      for (size_t k = 0; k < segment_unit_.size(); ++k) {
        const int64_t n = segment_grads_[k].numel(), off = segment_shard_offset_[k];
        grads.push_back(adam_->segments()[k].grad);
        // A host shard (parameter offload apart) is its own staging buffer: the paged masters are cast
        // straight into it, and the copy up is skipped (ChunkTransfers::send: the same memory).
        const auto& st = *units_[segment_unit_[k]];
        stages.push_back((st.host_stage.defined() ? st.host_stage : st.shard).narrow(0, off, n));
      }
      state_moves_ = std::make_unique<ChunkTransfers>(host_shards(), std::move(grads), std::move(stages),
                                                      make_offload_transfers(options_.device), offload_->chunk_pieces());
    }
  }
  if (options_.offload_cpu) {
    if (options_.stage == 0)
      fail("internal: the host optimizer needs ZeRO stage 1, 2 or 3 (config_options.cpp sets offload_cpu only there)");
    // The engine's optimizer is the host optimizer's. On a CPU device its masters and gradient views
    // are used in place; apart, the host gradients are filled from the device's and the masters cast
    // into the device shards (through the units' staging buffers where the dtypes differ).
    host_optimizer_ = std::make_unique<HostOptimizer>(*adam_, host_shards(), make_offload_transfers(options_.device),
                                                       HostOptimizerOptions{options_.offload_cpu_chunk_elements});
  }
  if (options_.offload_param_nvme) {
    if (options_.stage != 3)
      fail("zero_optimization.offload_param.device \"nvme\" needs ZeRO stage 3 (DeepSpeed offloads parameters only at "
           "stage 3); set zero_optimization.stage to 3, or zero_optimization.offload_param.device to \"none\"");
    if (!options_.device.is_cpu() && !params_apart_)
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
    param_offload_ = std::make_unique<ParamOffload>(std::move(shards), po);
    StateOffload::return_freed_memory();
  }
  if (params_apart_) uploads_ = make_shard_uploads(options_.device);
  unit_unscale_.assign(units_.size(), 1.0);
  segment_unscale_.assign(segment_unit_.size(), 1.0);
  rs_buckets_ = make_reduce_scatter_buckets();
  choose_units_kept_for_backward();
  // Stages 2-3 reduce each unit as its gradients complete in every micro-step's backward; stage 1 in
  // the boundary micro-step's backward only (on_param_grad_ready), as DeepSpeed's stage 1 does.
  if (options_.stage >= 1) {
    for (size_t k = 0; k < params.size(); ++k)
      if (packs(k)) on_gradient_ready(params[k].tensor, [this, k] { on_param_grad_ready(k); }, accumulators_);
  }
}

ZeroEngine::~ZeroEngine() = default;

std::vector<HostShard> ZeroEngine::host_shards() const {
  std::vector<HostShard> shards;
  const auto& segs = adam_->segments();
  for (size_t k = 0; k < segs.size(); ++k) {
    const auto& st = *units_[segment_unit_[k]];
    const int64_t n = segment_grads_[k].numel(), off = segment_shard_offset_[k];
    // A host shard (parameter offload apart) is where a 16-bit cast lands itself: its own staging buffer.
    const bool host_shard = params_apart_ && !st.persistent && separate_master_;
    shards.push_back({segs[k], st.shard.narrow(0, off, n), segment_grads_[k],
                      st.host_stage.defined() ? st.host_stage.narrow(0, off, n)
                      : host_shard            ? st.shard.narrow(0, off, n)
                                              : at::Tensor()});
  }
  return shards;
}

bool ZeroEngine::shard_is_master(size_t u) const { return units_[u]->master.is_same(units_[u]->shard); }

void ZeroEngine::start_gather(size_t u) {
  auto& st = *units_[u];
  if (st.params != UnitState::Params::Released) return;
  const size_t bytes = layout_.units[u].padded_numel * st.flat.element_size();
  const bool read = param_offload_ && param_offload_->offloaded(u);
  const bool upload = params_apart_ && !st.persistent;  // the host shard (or its file) up into the slot
  if (read && !upload) ParamOffload::set_aligned_storage(st.flat, bytes, /*zeroed=*/false);  // O_DIRECT reads in
  else set_storage_bytes(st.flat, bytes);
  gathered_now_ += bytes;
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  if (read || upload) {  // the file or the copy up first; launch_read_gathers gathers in place
    const int64_t S = layout_.units[u].shard_numel;
    const auto slot = st.flat.narrow(0, shard_index() * S, S);
    if (read && upload) {  // the file into a host bounce buffer; up from there once it landed
      st.bounce = host_buffer(S, st.flat.scalar_type(), options_.device.is_cuda());
      if (options_.device.is_cpu()) ParamOffload::set_aligned_storage(st.bounce, st.bounce.nbytes(), false);
      st.read = param_offload_->read_into(u, st.bounce.data_ptr());
    } else if (read) {
      st.read = param_offload_->read_into(u, slot.data_ptr());
    } else {
      uploads_->start(u, slot, st.shard);
    }
    st.params = UnitState::Params::Reading;
    reading_.push_back(u);
    return;
  }
  const comm::FlightContext label([&] { return "gather " + layout_.units[u].name; });  // names the call in flight records
  st.gather_work = dp_->all_gather_async(st.shard, st.flat);
  st.params = UnitState::Params::InFlight;
}

// Parameter offload: the all-gathers of the units whose files were being read, in the order the reads
// started, up to `upto`. Every rank makes the same calls in the same order, so the
// collectives match whatever the disk does; each waits for its own read only.
void ZeroEngine::launch_read_gathers(size_t upto) {
  size_t k = 0;
  while (k < reading_.size()) {
    const size_t v = reading_[k++];
    auto& sv = *units_[v];
    sv.read.wait();
    const int64_t S = layout_.units[v].shard_numel;
    if (sv.bounce.defined()) uploads_->start(v, sv.flat.narrow(0, shard_index() * S, S), sv.bounce);
    if (uploads_) uploads_->wait(v);
    sv.bounce = at::Tensor();  // a GPU's pinned block is reused only once its copy ran (the host allocator's event)
    const comm::FlightContext label([&] { return "gather " + layout_.units[v].name; });
    sv.gather_work = dp_->all_gather_async(sv.flat.narrow(0, shard_index() * S, S), sv.flat);
    sv.params = UnitState::Params::InFlight;
    if (v == upto) break;
  }
  reading_.erase(reading_.begin(), reading_.begin() + static_cast<std::ptrdiff_t>(k));
}

void ZeroEngine::gather(size_t u) {
  auto& st = *units_[u];
  start_gather(u);
  if (st.params == UnitState::Params::Reading) launch_read_gathers(u);
  if (st.params == UnitState::Params::InFlight) {
    st.gather_work->wait();  // never read a half-arrived buffer
    st.gather_work.reset();
    st.params = UnitState::Params::Ready;
  }
}

void ZeroEngine::release(size_t u) {
  auto& st = *units_[u];
  if (st.persistent || st.params == UnitState::Params::Released) return;
  if (st.params == UnitState::Params::Reading) {  // read ahead, never gathered (alike on every rank)
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
  st.params = UnitState::Params::Released;
}

void ZeroEngine::prefetch_after(size_t u, int direction) {
  if (options_.stage != 3) return;
  // Parameter offload: the oldest read, started at an earlier unit, has had its compute to land: gather
  // it now (one per hook, so a wide window does not wait here for all of its reads), then start reading
  // the rest of this window. Without offload every start gathers at once.
  if (!reading_.empty()) launch_read_gathers(reading_.front());
  for (size_t v : stage3_prefetch_window(layout_, u, direction, options_.prefetch_numel, options_.persistence_threshold))
    start_gather(v);  // no-op where already gathered or in flight
}

// The backward of the last unit (a pipeline stage's own last) gathers it and prefetches the units
// below it, up to prefetch_numel elements, when the activations, and so the memory in use, peak.
// Those units, kept gathered from their forward to their backward instead, are not gathered twice.
// (DeepSpeed's stage3_max_reuse_distance, measured in the window the engine already gathers.)
void ZeroEngine::choose_units_kept_for_backward() {
  kept_for_backward_.assign(units_.size(), 0);
  if (!units_.empty()) complete_at_ = stage3_gradients_complete_at(layout_, 0, units_.size() - 1);
  if (options_.stage == 3)
    kept_for_backward_ =
        stage3_units_kept_for_backward(layout_, options_.prefetch_numel, options_.persistence_threshold);
}

// zb_h1's B (model/weight_grad_deferral.h) computes only input gradients and fires no gradient hook, so
// on_param_grad_ready, which releases a unit once its gradients arrived, runs only in W. Parameters are
// needed only by B (dX = dY·W; W's dW = dYᵀ·X reads none), so when B reaches unit u, every unit above
// it whose gradients would be complete by now is released: the moment a whole backward releases it
// (stage3_schedule.h), so B gathers no more at once than a backward does.
void ZeroEngine::release_after_input_backward(size_t u) {
  for (size_t v = u + 1; v < units_.size(); ++v)
    if (complete_at_[v] > u) release(v);
}

void ZeroEngine::before_unit(size_t u) {
  gather(u);
  for (size_t other : layout_.units[u].also_reads) gather(other);
  prefetch_after(u, +1);
}

at::Tensor ZeroEngine::after_unit(size_t u, const at::Tensor& output) {
  const bool backward_follows = at::GradMode::is_enabled();
  if (!(backward_follows && kept_for_backward_[u])) {
    release(u);
    for (size_t other : layout_.units[u].also_reads) release(other);
  }
  if (!backward_follows) return output;
  at::Tensor out = output;
  // In backward: the re-gather below runs first, then the backward signal moves from the scale of
  // the unit above to this unit's own.
  if (!unit_scales_.empty() && u + 1 < unit_scales_.size()) {
    const double factor = unit_scales_[u] / unit_scales_[u + 1];
    if (factor != 1.0) out = scale_gradient(out, factor);
  }
  if (options_.stage == 3) out = PreBackwardHook::apply(out, reinterpret_cast<int64_t>(this), static_cast<int64_t>(u));
  return out;
}

void ZeroEngine::prepare_backward(bool boundary) {
  // A bucket holding a unit this backward never reached (a pipeline stage's unused units) is
  // reduced now, with zeros for that unit, before the next backward fills its buffer again.
  if (rs_buckets_) rs_buckets_->flush();
  sync_ = boundary;
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->grads_pending = layout_.units[u].params.size();
}

void ZeroEngine::on_param_grad_ready(size_t param) {
  const size_t u = unit_of_param_[param];
  auto& st = *units_[u];
  if (st.grads_pending == 0) fail("ZeRO: gradient of parameter ", param, " arrived twice in one backward");
  if (--st.grads_pending == 0) {
    if (options_.stage >= 2) {
      reduce_unit_gradients(u);
      if (options_.stage == 3) release(u);
    } else if (sync_) {  // stage 1 accumulates full gradients until the boundary's backward
      start_stage1_reduction(u);
    }
  }
  // Hands landed reductions over (stage 1 unit by unit waits for its own at finish_gradient_sync).
  if (options_.stage >= 2 || rs_buckets_) complete_reductions(false);
}

// Stage 1, in the boundary micro-step's backward (or at finish_gradient_sync for a unit whose gradients
// never completed there): unit u's accumulated full gradient starts its reduce-scatter, so it overlaps
// the rest of the backward. This rank's reduced piece lands in its own region of grad_flat (the
// bucket's deliver, or finish_gradient_sync from rs_recv), where the optimizer segments point. The
// collectives and their sizes are those the boundary would issue, so the results are the same bits.
void ZeroEngine::start_stage1_reduction(size_t u) {
  auto& st = *units_[u];
  if (st.rs_launched) return;
  st.rs_launched = true;
  const comm::FlightContext label("reduce-scatter " + layout_.units[u].name);
  if (rs_buckets_) {
    rs_buckets_->send_rows(u).copy_(st.grad_flat.view({dp_->size(), layout_.units[u].shard_numel}));
    rs_buckets_->unit_ready(u);
  } else {
    st.rs_recv = at::empty({st.shard.numel()}, st.grad_flat.options());
    st.rs_work = dp_->reduce_scatter_async(st.grad_flat, st.rs_recv);
  }
  if (!options_.overlap_comm) {
    if (rs_buckets_) rs_buckets_->complete(true);
    else if (st.rs_work) st.rs_work->wait();
  }
}

void ZeroEngine::reduce_unit_gradients(size_t u) {
  const comm::FlightContext label([&] { return "reduce-scatter " + layout_.units[u].name; });
  if (rs_buckets_) return reduce_unit_into_bucket(u);
  auto& st = *units_[u];
  const auto& fu = layout_.units[u];
  complete_reductions(false);
  if (st.rs_work) {  // the previous micro-step's reduction of this unit must land first
    st.rs_work->wait();
    complete_reductions(false);
  }
  auto& params = model_.parameters();
  const auto buffer = at::TensorOptions().device(options_.device).dtype(options_.compute_dtype);
  st.rs_send = at::empty({fu.padded_numel}, buffer);
  st.rs_send.narrow(0, fu.numel, fu.padded_numel - fu.numel).zero_();  // parameters fill the rest below
  for (const auto& fp : fu.params) {
    auto& g = params[fp.param_index].tensor.mutable_grad();
    st.rs_send.narrow(0, fp.offset, fp.numel).copy_(g.reshape({-1}));
    g = at::Tensor();  // release the full gradient: only the shard persists
  }
  st.rs_recv = at::empty({fu.shard_numel}, buffer);
  st.rs_work = dp_->reduce_scatter_async(st.rs_send, st.rs_recv);
  if (!options_.overlap_comm) complete_reductions(true);
}

void ZeroEngine::complete_reductions(bool all) {
  if (rs_buckets_) return rs_buckets_->complete(all);
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

void ZeroEngine::finish_gradient_sync(double loss_scale) {
  if (!sync_) return;
  const comm::FlightContext label("gradient sync");
  auto inv_for = [&](size_t u) {
    return 1.0 / (data_parallel_size() * (unit_scales_.empty() ? loss_scale : unit_scales_[u]));
  };
  if (options_.stage <= 1) {
    // Stage 1: every unit's full gradient was reduce-scattered during the boundary's backward
    // (start_stage1_reduction); a unit whose gradients never completed there (not used by this
    // micro-step's forward) starts now. This rank's reduced piece lands in its own region of the (no
    // longer needed) full buffer, where the optimizer segments point.
    // Stage 0: all-reduce it in place (every rank owns the whole unit).
    std::vector<comm::WorkPtr> works;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (options_.stage == 0) works.push_back(dp_->all_reduce_async(units_[u]->grad_flat));
      else start_stage1_reduction(u);
    }
    if (rs_buckets_ && options_.stage == 1) rs_buckets_->flush();
    for (size_t u = 0; u < units_.size(); ++u) {
      auto& st = *units_[u];
      if (options_.stage == 0) works[u]->wait();
      const int64_t S = layout_.units[u].shard_numel;
      auto mine = gradient_shard_of(st, S);
      if (st.rs_work) {
        st.rs_work->wait();
        mine.copy_(st.rs_recv);
        st.rs_work.reset();
        st.rs_recv = at::Tensor();
      }
      st.rs_launched = false;
      if (options_.replicas) options_.replicas->all_reduce(mine);  // hybrid: the other shard groups' sums
      // fp16 cannot hold unscaled small gradients: keep them scaled, unscale in fp32 when read.
      if (options_.compute_dtype == at::kHalf) unit_unscale_[u] = inv_for(u);
      else mine.mul_(inv_for(u));
    }
  } else {
    if (rs_buckets_) rs_buckets_->flush();
    complete_reductions(true);
    if (options_.replicas) {  // hybrid: add the other shard groups' sums, all units in flight at once
      std::vector<comm::WorkPtr> works;
      for (auto& st : units_) works.push_back(options_.replicas->all_reduce_async(st->grad_shard));
      for (auto& w : works) w->wait();
    }
    for (size_t u = 0; u < units_.size(); ++u) units_[u]->grad_shard.mul_(inv_for(u));
  }
  for (size_t k = 0; k < segment_unit_.size(); ++k) segment_unscale_[k] = unit_unscale_[segment_unit_[k]];
  sync_ = false;
}

std::vector<UnitGradStats> ZeroEngine::unit_grad_stats() {
  // [non-finite flag, largest |gradient|] per unit, from this rank's shard, computed where the
  // gradients live and read back in one transfer; then MAX over ranks.
  const int64_t n = static_cast<int64_t>(units_.size());
  std::vector<at::Tensor> per_unit;
  for (int64_t u = 0; u < n; ++u) {
    const int64_t S = layout_.units[u].shard_numel;
    const auto g = gradient_shard_of(*units_[u], S).to(at::kFloat);
    const auto largest = S > 0 ? g.abs().max() : at::zeros({}, g.options());
    per_unit.push_back(at::stack({at::isfinite(g).all().logical_not().to(at::kFloat), largest}));
  }
  const auto local = at::stack(per_unit).to(at::kCPU, at::kDouble);
  auto stats = at::zeros({2 * n}, at::kDouble);
  for (int64_t u = 0; u < n; ++u) {
    const bool finite = local[u][0].item<double>() == 0.0;
    stats[2 * u] = finite ? 0.0 : 1.0;
    stats[2 * u + 1] = finite ? local[u][1].item<double>() * unit_unscale_[u] : 0.0;
  }
  dp_->all_reduce(stats, comm::ReduceOp::Max);
  std::vector<UnitGradStats> out(n);
  for (int64_t u = 0; u < n; ++u) out[u] = {stats[2 * u].item<double>() > 0, stats[2 * u + 1].item<double>()};
  return out;
}

at::Tensor ZeroEngine::gradient_shard_of(UnitState& st, int64_t S) const {
  return options_.stage <= 1 ? st.grad_flat.narrow(0, shard_index() * S, S) : st.grad_shard;
}

at::Tensor ZeroEngine::unit_gradient_shard(size_t u) {
  return gradient_shard_of(*units_[u], layout_.units[u].shard_numel);
}

void ZeroEngine::skip_step() {
  for (auto& st : units_) {
    if (options_.stage <= 1) st->grad_flat.zero_();
    else st->grad_shard.zero_();
  }
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
  if (params_apart_)
    for (size_t u = 0; u < units_.size(); ++u) release(u);
  if (offload_ || param_offload_) page_out_states(/*write=*/true);  // a view that paged them in and kept them
  if (offload_) {
    // Parameter offload too: each chunk's units are paged in before it steps (fp32 in place: the shard
    // is the master the pieces update, read from its file; 16-bit, or apart: the shard the paged masters
    // are cast to, every element written, so not read) and written back once the stream has passed them.
    // 8-bit blocks shared between ranks read the fp32 masters in a pass of their own first: then every
    // shard that is its master is paged in for the step. Apart (ZeRO-Infinity on a GPU), a host shard is
    // the cast's staging buffer itself: nothing more is allocated for it, and no copy up runs.
    size_t passed = 0, chunk = 0;  // chunk: the one stepping now
    if (state_moves_) state_moves_->begin(offload_->shares_blocks());  // apart: the gradients come down
    if (param_offload_ && !masters_offloaded_ && adam_options_.state_precision == optim::StatePrecision::Int8 &&
        shards() > 1)
      for (size_t u = 0; u < units_.size(); ++u) param_offload_->page_in(u, /*read=*/true);
    auto before = [&](const std::vector<size_t>& segments) {
      if (state_moves_) state_moves_->gradients(chunk++);
      if (!param_offload_ || segments.empty()) return;
      for (; passed < segment_unit_[segments.front()]; ++passed) param_offload_->page_out(passed, /*write=*/true);
      for (size_t k : segments)
        if (!param_offload_->paged_in(segment_unit_[k])) param_offload_->page_in(segment_unit_[k], !masters_offloaded_);
    };
    // Each piece's master is in a chunk buffer only while its chunk steps: cast it to the shard then.
    offload_->step(lr, &segment_unscale_, [&](const optim::AdamW::Piece& p) {
      if (state_moves_) {  // apart: cast into the staging buffer, up while the next piece steps
        const OffloadPiece piece{p.segment, p.begin, p.numel};
        state_moves_->cast(piece, p.param);
        return state_moves_->send(chunk - 1, piece);
      }
      if (!separate_master_) return;
      auto& st = *units_[segment_unit_[p.segment]];
      st.shard.narrow(0, segment_shard_offset_[p.segment] + p.begin, p.numel).copy_(p.param);
    }, before);
    if (param_offload_) param_offload_->finish(/*write=*/true);
    if (state_moves_) state_moves_->finish();
  } else if (host_optimizer_) {
    // NVMe parameter shards get memory for the step and go back to their files after it (all at once:
    // buffer_count does not bound this step). Where the masters are apart from them (fp32 masters under
    // 16-bit compute) the step writes every element; where the host optimizer's masters are the shards
    // themselves (fp32 compute and bf16 masters, in place or apart) they are read from their files (and
    // the copy back is then a copy onto itself, skipped).
    if (param_offload_)
      for (size_t u = 0; u < units_.size(); ++u) param_offload_->page_in(u, /*read=*/shard_is_master(u));
    host_optimizer_->step(lr, &segment_unscale_);  // copies the updated parameters back itself
    if (param_offload_) param_offload_->finish(/*write=*/true);
  } else if (param_offload_) {
    step_offloaded_parameters(lr);
  } else {
    adam_->step(lr, &segment_unscale_);
  }
  // Stage 3: a unit still gathered now would hold the values from before this update; release it,
  // so the next use gathers the updated shards. (The rules of stage3_schedule.h release every unit
  // by the end of backward; this is the safeguard.)
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& st = units_[u];
    const bool on_disk = param_offload_ && param_offload_->offloaded(u);  // written by the step itself
    if (!offload_ && !host_optimizer_ && !on_disk && !st->master.is_same(st->shard)) st->shard.copy_(st->master);
    if (options_.stage <= 1) st->grad_flat.zero_();
    else st->grad_shard.zero_();
  }
  refresh_persistent_parameters();
  ++steps_seen_;
}

// The step's update of offloaded parameter shards, unit by unit in order (the files read ahead), each
// written back once updated: 16-bit compute steps the resident fp32 masters and casts each unit to a
// fresh shard; fp32 steps the shard itself (the master), in pieces (optim/adamw.h step_pieces: the
// same arithmetic as one step), except where 8-bit blocks shared between ranks need every segment's
// master first (optim/adamw.h collect_shared_maxima): then all shards are paged in for the step. (Lamb,
// whose trust ratio needs whole segments, is refused at stage 3.)
void ZeroEngine::step_offloaded_parameters(double lr) {
  auto& po = *param_offload_;
  if (separate_master_ || params_apart_) {  // apart: the masters are the device's
    adam_->step(lr, &segment_unscale_);
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!po.offloaded(u)) continue;
      po.page_in(u, /*read=*/false);
      units_[u]->shard.copy_(units_[u]->master);
      po.page_out(u, /*write=*/true);
    }
  } else if (adam_options_.state_precision == optim::StatePrecision::Int8 && shards() > 1) {
    for (size_t u = 0; u < units_.size(); ++u) po.page_in(u, /*read=*/true);
    adam_->step(lr, &segment_unscale_);
  } else {
    adam_->begin_step();
    size_t k = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      std::vector<optim::AdamW::Piece> pieces;
      for (; k < segment_unit_.size() && segment_unit_[k] == u; ++k) pieces.push_back(adam_->resident_piece(k));
      if (pieces.empty()) continue;
      po.page_in(u, /*read=*/true);
      adam_->step_pieces(lr, &segment_unscale_, pieces);
      po.page_out(u, /*write=*/true);
    }
  }
  po.finish(/*write=*/true);
}

std::vector<std::pair<std::string, at::Tensor>> ZeroEngine::gather_full_parameters() {
  // Offloaded fp32 masters: read them in for this, and drop them again after (unchanged).
  const bool paging = offload_ && masters_offloaded_ && !offload_->paged_in();
  if (paging) page_in_states();
  // Offloaded shards that are the masters (fp32, bf16 masters; apart, the host optimizer's): read them in
  // too, and drop them after.
  bool paging_params = false;
  for (size_t u = 0; u < units_.size() && param_offload_ && !params_paged_in_; ++u)
    paging_params = paging_params || (param_offload_->offloaded(u) && shard_is_master(u));
  if (paging_params)
    for (size_t u = 0; u < units_.size(); ++u) param_offload_->page_in(u, /*read=*/true);
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
    param_offload_->finish(/*write=*/false);
    ParamOffload::release_cached_blocks();
    StateOffload::return_freed_memory();
  }
  return out;
}

void ZeroEngine::page_in_states() {
  if (param_offload_ && !params_paged_in_) {  // the shards: the fp32 masters, or the 16-bit working pieces
    for (size_t u = 0; u < units_.size(); ++u) param_offload_->page_in(u, /*read=*/true);
    params_paged_in_ = true;
  }
  if (!offload_ || offload_->paged_in()) return;
  if (masters_offloaded_)  // host memory (apart too: the checkpoint reads it there)
    for (size_t u = 0; u < units_.size(); ++u)
      units_[u]->master = at::zeros({layout_.units[u].shard_numel}, separate_master_ ? at::kFloat : options_.compute_dtype);
  offload_->page_in([this](size_t k) {
    return units_[segment_unit_[k]]->master.narrow(0, segment_shard_offset_[k], adam_->segments()[k].grad.numel());
  });
}

void ZeroEngine::page_out_states(bool write) {
  if (params_paged_in_) {
    param_offload_->finish(write);
    params_paged_in_ = false;
    ParamOffload::release_cached_blocks();
    StateOffload::return_freed_memory();
  }
  if (!offload_ || !offload_->paged_in()) return;
  offload_->page_out(write);
  if (masters_offloaded_)
    for (auto& st : units_) st->master = at::Tensor();
  StateOffload::return_freed_memory();
}

std::vector<at::Tensor> ZeroEngine::segment_working_pieces() const {
  std::vector<at::Tensor> out;
  const auto& segments = adam_->segments();
  for (size_t k = 0; k < segments.size(); ++k) {
    const auto& st = *units_[segment_unit_[k]];
    if (st.master.is_same(st.shard) || !separate_master_) {  // the master is the shard, or (apart) a copy of it
      out.emplace_back();
      continue;
    }
    // The segment is a view into the master shard; the same elements of the compute shard.
    const int64_t first = segments[k].param.storage_offset() - st.master.storage_offset();
    out.push_back(st.shard.narrow(0, first, segments[k].param.numel()));
  }
  return out;
}

void ZeroEngine::masters_loaded(int64_t optimizer_steps, int64_t steps) {
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  for (auto& st : units_)
    if (st->master.defined() && !st->master.is_same(st->shard)) st->shard.copy_(st->master);
  refresh_persistent_parameters();
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

// 8-bit states: quantization blocks count from each parameter's element 0 (as bitsandbytes'), so a
// shard boundary inside a parameter may cut a block in two. Both parts must be quantized with the
// whole block's absmax, or the states would depend on the number of ranks: every block a boundary
// cuts gets a slot, numbered alike on every rank from the layout, and each step one MAX all-reduce
// of [2 x slots] floats agrees on their absmax (optim/adamw.h set_shared_blocks). Resharding then
// changes nothing: a run on 1, 2 or 3 ranks holds the same codes and absmax values.
void ZeroEngine::share_cut_quantization_blocks() {
  if (adam_options_.state_precision != optim::StatePrecision::Int8 || shards() == 1) return;
  std::map<std::pair<size_t, int64_t>, int64_t> slot_of;  // (parameter, block) -> slot
  for (const auto& fu : layout_.units) {
    for (const auto& fp : fu.params) {
      if (fp.numel < adam_options_.min_8bit_size) continue;
      for (int b = 1; b < shards(); ++b) {
        const int64_t cut = b * fu.shard_numel - fp.offset;  // the boundary, in the parameter's elements
        if (cut <= 0 || cut >= fp.numel || cut % optim::kQuantBlock == 0) continue;
        slot_of.emplace(std::pair{fp.param_index, cut / optim::kQuantBlock}, 0);
      }
    }
  }
  if (slot_of.empty()) return;
  int64_t count = 0;
  for (auto& [key, slot] : slot_of) slot = count++;
  const auto& segments = adam_->segments();
  std::vector<std::pair<int64_t, int64_t>> slots(segments.size(), {-1, -1});
  for (size_t k = 0; k < segments.size(); ++k) {
    if (adam_->format(k) != optim::StatePrecision::Int8) continue;
    const int64_t first = segments[k].param_offset, n = segments[k].param.numel();
    const auto lookup = [&](int64_t block) {
      const auto it = slot_of.find({segment_param_[k], block});
      return it == slot_of.end() ? int64_t{-1} : it->second;
    };
    slots[k] = {lookup(first / optim::kQuantBlock), lookup((first + n - 1) / optim::kQuantBlock)};
  }
  // Apart, the maxima are host memory: they travel through the device (a GPU communicator needs it).
  adam_->set_shared_blocks(std::move(slots), count, [this](const at::Tensor& t) {
    if (!apart_) return dp_->all_reduce(t, comm::ReduceOp::Max);
    const auto on_device = t.to(options_.device, false, /*copy=*/true);
    dp_->all_reduce(on_device, comm::ReduceOp::Max);
    t.copy_(on_device);
  });
}

ZeroMemory ZeroEngine::memory() const {
  auto m = zero_state_bytes(layout_, options_.stage, element_bytes(), options_.persistence_threshold, apart_,
                            apart_ && options_.offload_nvme, params_apart_);
  m.gathered_peak = gathered_peak_;
  if (param_offload_) {  // the planner moves the same bytes by the same function
    const int64_t b = offloaded_parameter_bytes(layout_, element_bytes().compute, options_.persistence_threshold,
                                                options_.offload_param_max_in_cpu);
    (params_apart_ ? m.host : m.compute_params) -= b;
    m.offloaded += b;
  }
  if (offload_) {  // on disk between steps (the planner moves the same bytes: plan/planner.cpp)
    m.offloaded += m.master_params + m.optimizer_states;
    m.master_params = m.optimizer_states = 0;
  }
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
    const bool host_shard = params_apart_ && !st.persistent;
    held.compute_params +=
        ((st.persistent ? st.flat.numel() : 0) + (options_.stage == 3 && !host_shard ? st.shard.numel() : 0)) *
        st.flat.element_size();
    if (host_shard) host_buffers += st.shard.numel() * st.shard.element_size();
    held.gradients += options_.stage <= 1 ? st.grad_flat.numel() * st.grad_flat.element_size()
                                          : st.grad_shard.numel() * st.grad_shard.element_size();
    const int64_t master = st.master.is_same(st.shard) ? 0 : st.master.numel() * st.master.element_size();
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
  const auto formula = memory();
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
      (params_apart_ ? parameter_shards_to_host(layout_, element_bytes(), options_.persistence_threshold, apart_).host
                     : 0);
  if (held.compute_params != formula.compute_params || held.gradients != formula.gradients ||
      held.master_params != formula.master_params || held.optimizer_states != (apart_ ? 0 : states) ||
      held.host != host)
    fail("internal: the ZeRO engine allocated ", held.total(), " bytes of model state (", held.host, " in host memory), "
         "its formula (shared with the planner) says ", formula.total(), " (", formula.host, "); "
         "parallel/zero/zero_memory.cpp and the engine disagree");
}

// Full compute parameters where they persist (every unit below stage 3, stage 3's small ones)
// from the updated shards, in allgather_bucket_size buckets (zero_gather_buckets.h). Stage 0's
// shard is the whole unit.
void ZeroEngine::refresh_persistent_parameters() {
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

// Reduce-scatter buckets (zero_buckets.h) for stages 1-3 on more than one rank, unless
// reduce_bucket_size is 0 (unit by unit, as before buckets existed: for comparisons).
std::unique_ptr<ReduceScatterBuckets> ZeroEngine::make_reduce_scatter_buckets() {
  if (options_.stage == 0 || dp_->size() == 1 || options_.reduce_bucket_numel <= 0) return nullptr;
  std::vector<int64_t> shard_numel;
  for (const auto& fu : layout_.units) shard_numel.push_back(fu.shard_numel);
  const int64_t r = shard_index();
  auto deliver = [this, r](size_t u, const at::Tensor& reduced) {
    auto& st = *units_[u];
    if (options_.stage == 1) st.grad_flat.narrow(0, r * reduced.numel(), reduced.numel()).copy_(reduced);
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

void ZeroEngine::reduce_unit_into_bucket(size_t u) {
  const auto& fu = layout_.units[u];
  const int64_t S = fu.shard_numel, n = dp_->size();
  auto rows = rs_buckets_->send_rows(u);  // [n, S]: row p receives elements [p·S, (p+1)·S) of the unit
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
  auto& params = model_.parameters();
  for (const auto& fp : fu.params) {
    auto& g = params[fp.param_index].tensor.mutable_grad();
    const auto flat = g.reshape({-1});
    put(fp.offset, fp.numel, &flat);
    g = at::Tensor();  // release the full gradient: only the shard persists
  }
  put(fu.numel, fu.padded_numel - fu.numel, nullptr);
  rs_buckets_->unit_ready(u);
  if (!options_.overlap_comm) complete_reductions(true);
}

}  // namespace shardlm::parallel
