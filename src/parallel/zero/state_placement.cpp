// ZeRO's optimizer-state placement and precision: where the fp32 (or bf16) masters and the Adam
// moments live, and how the step reaches them. It is chosen by zero_policies (zero_policies.h) apart
// from the parameters' residency (parameter_residency.h) and the gradients' reduction
// (gradient_reduction.h):
//   device: masters and moments beside the shards (16-bit compute: a separate fp32 master; fp32 and
//       bf16 masters: the shard is the master), one AdamW step;
//   host (offload_optimizer "cpu", host_optimizer.h): the chunked CPU AdamW; apart from the device (a
//       GPU run) masters and moments are host memory, the reduced gradients come down and the updated
//       parameters go up;
//   NVMe (offload_optimizer "nvme", state_offload.h): masters and moments in files between steps,
//       streamed chunk by chunk through the step (apart: through host buffers, ChunkTransfers).
// These are the engine's member functions for that placement (ZeroEngine composes the three
// policies); the collectives they need (8-bit blocks' shared maxima) go through the communicator.
#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>

#include "parallel/zero/zero_engine.h"
#include "util/error.h"

namespace shardlm::parallel {

// Unit u's optimizer-state buffers (after its residency and gradients): its master (fp32 [S]; the
// shard itself in fp32 and with bf16 masters; apart from the device a host tensor) and, apart, the
// host gradient and staging buffers; and its AdamW segments, the pieces of each parameter that fall in
// this rank's shard. `packed` and `master_full` (16-bit compute's unrounded fp32 weights, else
// undefined) hold the whole unit on the CPU.
void ZeroEngine::place_unit_states(size_t u, const at::Tensor& packed, const at::Tensor& master_full,
                                   std::vector<optim::Segment>& segments) {
  const auto& fu = layout_.units[u];
  const int64_t S = fu.shard_numel, r = shard_index();
  const auto compute = options_.compute_dtype;
  const auto on_device = at::TensorOptions().device(options_.device);
  const bool separate_master = master_full.defined();
  const bool pinned = apart_ && options_.device.is_cuda();
  auto copy_to_device = [&](const at::Tensor& t) { return t.to(on_device.dtype(t.scalar_type()), false, /*copy=*/true); };
  auto st = std::make_unique<UnitState>();
  const auto& shard = residency_->shard(u);
  const bool host_shard = residency_->host_shard(u);
  if (apart_) {  // host memory only, for the host optimizer (its segments below are views of these)
    // Pinned where a copy reads or writes it: the gradients, the cast parameters, and a master that
    // goes up itself (fp32 compute); a 16-bit run's fp32 master and the moments never move. NVMe: the
    // master goes to the files, and every run's parameters go up from a staging buffer.
    const auto from = separate_master ? master_full.narrow(0, r * S, S) : packed.narrow(0, r * S, S);
    if (host_shard && !separate_master && !options_.offload_nvme) {
      // A host shard (parameter offload apart) of the master's dtype and values (fp32 compute, bf16
      // masters) is the master: one buffer, as the shard is in place on a CPU run; NVMe parameters
      // page it through their files, so the master lives there between steps.
      st->master = shard;
    } else {
      st->master = host_buffer(S, from.scalar_type(), pinned && !separate_master && !options_.offload_nvme);
      st->master.copy_(from);
    }
    st->host_grad = host_buffer(S, gradients_->shard_dtype(), pinned).zero_();
    // NVMe: every run's parameters go up from a staging buffer; a host shard (parameter offload) is its own.
    if ((separate_master || options_.offload_nvme) && !host_shard) st->host_stage = host_buffer(S, compute, pinned);
  } else if (host_shard) {  // the masters stay on the device (fp32 too: the shard is host memory now)
    st->master = copy_to_device(separate_master ? master_full.narrow(0, r * S, S) : packed.narrow(0, r * S, S));
  } else {
    st->master = separate_master ? copy_to_device(master_full.narrow(0, r * S, S)) : shard;
  }
  // AdamW segments: the pieces of each parameter that fall in this rank's shard.
  for (const auto& fp : fu.params) {
    const int64_t lo = std::max(fp.offset, r * S), hi = std::min(fp.offset + fp.numel, (r + 1) * S);
    if (lo >= hi) continue;
    const auto grad = gradients_->shard(u).narrow(0, lo - r * S, hi - lo);
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

// After every unit: the optimizer over the segments, and where its states live (zero_policies.h):
// on the device, in NVMe files (StateOffload; apart from the device, with the chunk transfers between
// them) or in host memory (HostOptimizer). The memory formula is checked on the way.
void ZeroEngine::start_states(const optim::AdamWOptions& adam, std::vector<optim::Segment> segments, int file_rank) {
  // bf16 masters: the bf16 shard is the master (apart from the device: its bf16 host copy, which the host
  // optimizer steps and the NVMe files page with Kahan's compensation beside the moments; NVMe parameter
  // offload in place pages the shard, the master, as it pages fp32 compute's). Parameter shards apart from
  // the device (a GPU's offload_param) are the host optimizer's masters themselves; NVMe states would page
  // a second copy of them, and without optimizer offload the masters would be the device's.
  if (adam.masters != optim::MasterRounding::None && options_.compute_dtype != at::kBFloat16)
    fail("optimizer.master_precision \"bf16\" needs bf16 compute; set bf16.enabled, or optimizer.master_precision ",
         "\"fp32\"");
  if (adam.masters != optim::MasterRounding::None && policies_.params_apart && !options_.offload_cpu)
    fail("optimizer.master_precision \"bf16\" with parameter shards apart from the device (a GPU's ",
         "zero_optimization.offload_param) needs zero_optimization.offload_optimizer.device \"cpu\": the host shards ",
         "are then its bf16 masters (NVMe states would page a second copy of them); set offload_optimizer.device to ",
         "\"cpu\", offload_param.device to \"none\", or optimizer.master_precision to \"fp32\"");
  adam_ = std::make_unique<optim::AdamW>(std::move(segments), adam);
  share_cut_quantization_blocks();
  check_memory_formula();
  separate_master_ = at::elementSize(options_.compute_dtype) < 4 && adam.masters == optim::MasterRounding::None;
  if (options_.offload_nvme) {
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
        stages.push_back((st.host_stage.defined() ? st.host_stage : residency_->shard(segment_unit_[k])).narrow(0, off, n));
      }
      state_moves_ = std::make_unique<ChunkTransfers>(host_shards(), std::move(grads), std::move(stages),
                                                      make_offload_transfers(options_.device), offload_->chunk_pieces());
    }
  }
  if (options_.offload_cpu) {
    // The engine's optimizer is the host optimizer's. On a CPU device its masters and gradient views
    // are used in place; apart, the host gradients are filled from the device's and the masters cast
    // into the device shards (through the units' staging buffers where the dtypes differ).
    host_optimizer_ = std::make_unique<HostOptimizer>(*adam_, host_shards(), make_offload_transfers(options_.device),
                                                       HostOptimizerOptions{options_.offload_cpu_chunk_elements});
  }
}

// The optimizer step where the states live: streamed through NVMe files chunk by chunk, on the host
// optimizer, over NVMe parameter shards, or on the device.
void ZeroEngine::step_states(double lr) {
  if (offload_) {
    // Parameter offload too: each chunk's units are paged in before it steps (fp32 in place: the shard
    // is the master the pieces update, read from its file; 16-bit, or apart: the shard the paged masters
    // are cast to, every element written, so not read) and written back once the stream has passed them.
    // 8-bit blocks shared between ranks read the fp32 masters in a pass of their own first: then every
    // shard that is its master is paged in for the step. Apart (ZeRO-Infinity on a GPU), a host shard is
    // the cast's staging buffer itself: nothing more is allocated for it, and no copy up runs.
    size_t passed = 0, chunk = 0;  // chunk: the one stepping now
    if (state_moves_) state_moves_->begin(offload_->shares_blocks());  // apart: the gradients come down
    if (files() && !masters_offloaded_ && adam_options_.state_precision == optim::StatePrecision::Int8 &&
        shards() > 1)
      for (size_t u = 0; u < units_.size(); ++u) files()->page_in(u, /*read=*/true);
    auto before = [&](const std::vector<size_t>& segments) {
      if (state_moves_) state_moves_->gradients(chunk++);
      if (!files() || segments.empty()) return;
      for (; passed < segment_unit_[segments.front()]; ++passed) files()->page_out(passed, /*write=*/true);
      for (size_t k : segments)
        if (!files()->paged_in(segment_unit_[k])) files()->page_in(segment_unit_[k], !masters_offloaded_);
    };
    // Each piece's master is in a chunk buffer only while its chunk steps: cast it to the shard then.
    offload_->step(lr, &segment_unscale_, [&](const optim::AdamW::Piece& p) {
      if (state_moves_) {  // apart: cast into the staging buffer, up while the next piece steps
        const OffloadPiece piece{p.segment, p.begin, p.numel};
        state_moves_->cast(piece, p.param);
        return state_moves_->send(chunk - 1, piece);
      }
      if (!separate_master_) return;
      residency_->shard(segment_unit_[p.segment]).narrow(0, segment_shard_offset_[p.segment] + p.begin, p.numel)
          .copy_(p.param);
    }, before);
    if (files()) files()->finish(/*write=*/true);
    if (state_moves_) state_moves_->finish();
  } else if (host_optimizer_) {
    // NVMe parameter shards get memory for the step and go back to their files after it (all at once:
    // buffer_count does not bound this step). Where the masters are apart from them (fp32 masters under
    // 16-bit compute) the step writes every element; where the host optimizer's masters are the shards
    // themselves (fp32 compute and bf16 masters, in place or apart) they are read from their files (and
    // the copy back is then a copy onto itself, skipped).
    if (files())
      for (size_t u = 0; u < units_.size(); ++u) files()->page_in(u, /*read=*/shard_is_master(u));
    host_optimizer_->step(lr, &segment_unscale_);  // copies the updated parameters back itself
    if (files()) files()->finish(/*write=*/true);
  } else if (files()) {
    step_offloaded_parameters(lr);
  } else {
    adam_->step(lr, &segment_unscale_);
  }
}

std::vector<HostShard> ZeroEngine::host_shards() const {
  std::vector<HostShard> shards;
  const auto& segs = adam_->segments();
  for (size_t k = 0; k < segs.size(); ++k) {
    const size_t u = segment_unit_[k];
    const auto& st = *units_[u];
    const auto& shard = residency_->shard(u);
    const int64_t n = segment_grads_[k].numel(), off = segment_shard_offset_[k];
    // A host shard (parameter offload apart) is where a 16-bit cast lands itself: its own staging buffer.
    const bool host_shard = residency_->host_shard(u) && separate_master_;
    shards.push_back({segs[k], shard.narrow(0, off, n), segment_grads_[k],
                      st.host_stage.defined() ? st.host_stage.narrow(0, off, n)
                      : host_shard            ? shard.narrow(0, off, n)
                                              : at::Tensor()});
  }
  return shards;
}

bool ZeroEngine::shard_is_master(size_t u) const { return units_[u]->master.is_same(residency_->shard(u)); }

// The step's update of offloaded parameter shards, unit by unit in order (the files read ahead), each
// written back once updated: 16-bit compute steps the resident fp32 masters and casts each unit to a
// fresh shard; fp32 steps the shard itself (the master), in pieces (optim/adamw.h step_pieces: the
// same arithmetic as one step), except where 8-bit blocks shared between ranks need every segment's
// master first (optim/adamw.h collect_shared_maxima): then all shards are paged in for the step. (Lamb,
// whose trust ratio needs whole segments, is refused at stage 3.)
void ZeroEngine::step_offloaded_parameters(double lr) {
  auto& po = *files();
  if (separate_master_ || residency_->apart()) {  // apart: the masters are the device's
    adam_->step(lr, &segment_unscale_);
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!po.offloaded(u)) continue;
      po.page_in(u, /*read=*/false);
      residency_->shard(u).copy_(units_[u]->master);
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

void ZeroEngine::page_in_states() {
  residency_->page_in_all();  // NVMe shards: the fp32 masters, or the 16-bit working pieces
  if (!offload_ || offload_->paged_in()) return;
  if (masters_offloaded_)  // host memory (apart too: the checkpoint reads it there)
    for (size_t u = 0; u < units_.size(); ++u)
      units_[u]->master = at::zeros({layout_.units[u].shard_numel}, separate_master_ ? at::kFloat : options_.compute_dtype);
  offload_->page_in([this](size_t k) {
    return units_[segment_unit_[k]]->master.narrow(0, segment_shard_offset_[k], adam_->segments()[k].grad.numel());
  });
}

void ZeroEngine::page_out_states(bool write) {
  residency_->page_out_all(write);
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
    if (st.master.is_same(residency_->shard(segment_unit_[k])) || !separate_master_) {  // the master is the shard, or (apart) a copy of it
      out.emplace_back();
      continue;
    }
    // The segment is a view into the master shard; the same elements of the compute shard.
    const int64_t first = segments[k].param.storage_offset() - st.master.storage_offset();
    out.push_back(residency_->shard(segment_unit_[k]).narrow(0, first, segments[k].param.numel()));
  }
  return out;
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

}  // namespace shardlm::parallel
