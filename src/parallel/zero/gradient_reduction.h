// ZeRO's gradient-reduction policy: which collective reduces each unit's gradients, and when. It is
// chosen apart from where parameters (parameter_residency.h) and optimizer states
// (state_placement.cpp) live, and it owns the gradient buffers it reduces:
//   AllReduceAtBoundary (stage 0): full gradients accumulate over the micro-steps; after the
//       boundary micro-step's backward every unit is all-reduced in place (each rank owns it whole).
//   ReduceScatterLastMicroStep (stage 1): full gradients accumulate; in the backward of the
//       accumulation's last micro-step each unit is reduce-scattered as soon as its gradients are
//       complete (overlapping the rest of that backward, as DeepSpeed's stage 1 does), and this
//       rank's reduced piece lands in its own region of the full buffer.
//   ReduceScatterEveryMicroStep (stages 2, 3): in every micro-step's backward each complete unit is
//       copied into a flat buffer and reduce-scattered asynchronously, the full gradients released,
//       and only the persistent shard (grad_accum_dtype) kept. Deferring to the boundary would need
//       the full gradients kept across micro-steps, which is the memory stage 2 removes.
// Reduce-scatters of consecutive units are coalesced in reduce_bucket_size buckets (zero_buckets.h);
// hybrid sharding adds the replicas' sums at the boundary. The collectives are the communicator's
// (comm/): this file only decides which to call and when.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_policies.h"
#include "parallel/zero/zero_buckets.h"
#include "parallel/zero/zero_options.h"

namespace shardlm::parallel {

class GradientReduction {
 public:
  // `layout` is built over the ranks of `dp` (one rank for AllReduceAtBoundary: the whole unit); the
  // reduced gradients are averaged over `average_over` data-parallel ranks. Reads the device, dtypes,
  // overlap_comm, reduce_bucket_numel and replicas of `options`.
  GradientReduction(const FlatLayout& layout, std::vector<model::Parameter>& params, comm::CommPtr dp,
                    const ZeroOptions& options, GradReduction how, int average_over);
  ~GradientReduction();

  // Unit u's gradient buffers, as the engine packs it (after the parameters point into the unit): a
  // full buffer the parameters' .grad are views of, or the persistent shard.
  void add_unit(size_t u);
  // After every unit was added: the reduce-scatter buckets.
  void start();

  GradReduction how() const { return how_; }
  // The dtype of the reduced shard the optimizer reads.
  at::ScalarType shard_dtype() const { return keeps_full() ? options_.compute_dtype : options_.grad_accum_dtype; }
  // This rank's reduced gradient shard of unit u (a view: the optimizer's segments point into it).
  at::Tensor shard(size_t u) const;
  int64_t held_bytes(size_t u) const;  // the buffers of unit u

  // Before each micro-step's backward; `boundary`: the last micro-step of the accumulation.
  void prepare_backward(bool boundary);
  // A gradient of parameter `param` (of unit u) arrived; true once all of the unit's have (its
  // reduction has then started, where this policy starts it in this micro-step).
  bool gradient_arrived(size_t param, size_t u);
  // Hands over the reductions that have landed.
  void poll();
  // After the boundary's backward: every shard reduced, summed over the replicas and divided by
  // average_over × the loss scale (per unit: unit_scales[u]). false (nothing done) between boundaries.
  bool finish(double loss_scale, const std::vector<double>& unit_scales);
  // fp16 at stage 1 keeps reduced gradients scaled in the fp16 buffer: the factor that unscales unit
  // u's in fp32 where they are read (1 otherwise).
  double unscale(size_t u) const { return unit_unscale_[u]; }
  void zero();  // after a step, or a skipped one

 private:
  struct Unit;
  bool keeps_full() const { return how_ != GradReduction::ReduceScatterEveryMicroStep; }
  int shard_index() const { return how_ == GradReduction::AllReduceAtBoundary ? 0 : dp_->rank(); }
  void start_boundary_reduction(size_t u);   // stage 1: the boundary's reduce-scatter of a unit
  void reduce_unit(size_t u);                // every micro-step: flat copy + async reduce-scatter
  void reduce_unit_into_bucket(size_t u);
  void complete_reductions(bool all);
  void finish_full(const std::vector<double>& inv);
  void finish_shards(const std::vector<double>& inv);
  std::unique_ptr<ReduceScatterBuckets> make_buckets();

  const FlatLayout& layout_;
  std::vector<model::Parameter>& params_;
  comm::CommPtr dp_;
  ZeroOptions options_;
  GradReduction how_;
  int average_over_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::unique_ptr<ReduceScatterBuckets> buckets_;  // coalesced reductions; null: unit by unit
  bool sync_ = false;
  std::vector<double> unit_unscale_;
};

}  // namespace shardlm::parallel
