// ZeRO's parameter-residency policy: where a unit's compute parameters live between uses, and the
// gathers and releases that bring them where the forward and backward need them. It is chosen apart
// from how gradients are reduced (gradient_reduction.h) and where optimizer states live
// (state_placement.cpp), and it owns each unit's flat compute buffer and this rank's shard of it:
//   Replicated (stages 0-2): every unit whole on every rank (the shard is a view of it); after the
//       step the updated shards are all-gathered back into the units (allgather_bucket_size buckets,
//       zero_gather_buckets.h). Stage 0's shard is the whole unit.
//   Sharded (stage 3): between uses a unit above the persistence threshold exists only as this
//       rank's shard. It is gathered before its forward (prefetching the next ones), released after,
//       re-gathered right before its backward (prefetching the unit below) and released once its
//       gradients are reduced. The last units, which backward's first prefetch would gather again at
//       once, stay gathered from their forward to their backward (stage3_schedule.h). With NVMe
//       (offload_param "nvme", param_offload.h) the shards of those units live in files, read ahead
//       inside the prefetch window; apart from the device (a GPU's offload_param) they are host
//       tensors copied up into their gather slot (shard_uploads.h).
// The collectives are the communicator's (comm/); this file only decides which units to move and when.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_policies.h"
#include "parallel/zero/param_offload.h"
#include "parallel/zero/shard_uploads.h"
#include "parallel/zero/zero_gather_buckets.h"
#include "parallel/zero/zero_options.h"

namespace shardlm::parallel {

class ParameterResidency {
 public:
  // `layout` is built over the ranks of `dp` (one for stage 0's whole units); `apart`: the sharded
  // units' shards in host memory apart from the device. Reads the device, compute dtype, stage-3
  // thresholds, allgather_bucket_numel and offload_param_* of `options`.
  ParameterResidency(const FlatLayout& layout, comm::CommPtr dp, const ZeroOptions& options, ParamResidency how,
                     bool apart);
  ~ParameterResidency();

  // Unit u from its packed weights (compute dtype, on the CPU): its flat buffer and shard, the
  // parameters made views of the unit, and (a sharded unit) the full buffer released again.
  void add_unit(size_t u, const at::Tensor& packed, std::vector<model::Parameter>& params);
  // After every unit (and the optimizer's states) exist: the NVMe shard files and the uploads apart.
  void start(int file_rank);

  ParamResidency how() const { return how_; }
  bool apart() const { return apart_; }
  bool persistent(size_t u) const;
  bool host_shard(size_t u) const { return apart_ && !persistent(u); }  // a host tensor apart
  const at::Tensor& flat(size_t u) const;
  const at::Tensor& shard(size_t u) const;
  int64_t gathered_peak() const { return gathered_peak_; }
  ParamOffload* files() const { return files_.get(); }  // NVMe shards, else null

  // Forward: before unit u runs (gathers it and what it also reads, prefetches the next), and after
  // it (releases them, unless kept for the backward that follows).
  void before_forward(size_t u);
  void after_forward(size_t u, bool backward_follows);
  // The unit's output, wrapped so that its backward re-gathers the unit first (Sharded), else as is.
  at::Tensor wrap_for_backward(size_t u, const at::Tensor& output);
  void gather(size_t u);   // start (if needed) and complete the all-gather of a unit
  void release(size_t u);  // a sharded unit back to its shard alone (no-op where persistent)
  void release_all();
  // After the step: the persistent units' full parameters from their updated shards.
  void refresh();
  // NVMe shards paged in whole (checkpoints, gathering the full parameters), and back to the files.
  void page_in_all();
  void page_out_all(bool write);
  bool paged_in() const { return paged_in_; }

 private:
  struct Unit;
  friend struct PreBackwardHook;
  int rank() const { return options_.stage == 0 ? 0 : dp_->rank(); }
  void start_gather(size_t u);
  void launch_read_gathers(size_t upto);  // NVMe: gathers whose reads were started, in order
  void prefetch_after(size_t u, int direction);
  void release_after_input_backward(size_t u);  // zb_h1's B reached `u`: see parameter_residency.cpp

  const FlatLayout& layout_;
  comm::CommPtr dp_;
  ZeroOptions options_;
  ParamResidency how_;
  bool apart_;
  std::vector<std::unique_ptr<Unit>> units_;
  int64_t gathered_now_ = 0, gathered_peak_ = 0;
  // Sharded, per unit: not released after forward, as its backward gathers it first thing anyway.
  std::vector<char> kept_for_backward_;
  // Per unit: the lowest unit whose backward completes its gradients (itself, or a lower unit that
  // also reads it: the tied head's embedding).
  std::vector<size_t> complete_at_;
  std::unique_ptr<AllGatherBuckets> ag_buckets_;  // coalesced parameter refresh (made at first use)
  // NVMe: the shards' files; the units whose file is being read into their gather buffer (their
  // all-gathers start in this order, alike on every rank); the shards paged in for a checkpoint.
  std::unique_ptr<ParamOffload> files_;
  std::vector<size_t> reading_;
  bool paged_in_ = false;
  std::unique_ptr<ShardUploads> uploads_;  // apart: each host shard into its gather slot
};

}  // namespace shardlm::parallel
