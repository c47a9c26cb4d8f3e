// See parallelize.h.
#include "parallel/parallelize.h"

#include "parallel/ddp/ddp_strategy.h"
#include "parallel/zero/zero_strategy.h"

namespace shardlm::parallel {

std::unique_ptr<Strategy> parallelize(model::Llama& model, const ParallelDims& dims, const ParallelizeOptions& o) {
  ModelSplit split;
  // 1. Tensor parallelism: from here on the model holds this rank's shards.
  if (dims.tp > 1) {
    tp::check_tensor_parallel(model.config(), dims.tp, o.sequence_parallel, 0);
    split.tp = std::make_shared<TensorParallel>(model, dims.tp_comm, o.sequence_parallel);
  }
  // 2. Activation checkpointing.
  model.set_recompute(o.recompute);
  // 3. Pipeline parallelism: this rank keeps its stage's units.
  if (dims.pp > 1)
    split.pp = std::make_shared<PipelinePlacement>(
        model, dims.pp_comm, pp::layer_counts(model.config(), dims.pp, o.pipeline_split));
  // 4. Data parallelism over this position's data-parallel group.
  const auto dtype = o.zero.compute_dtype;
  if (o.zero.stage == 0 && (dtype == at::kFloat || dtype == at::kDouble)) {
    model.to(o.zero.device);
    return make_ddp_strategy(model, dims, std::move(split), o.ddp_bucket_bytes, o.adam);
  }
  return make_zero_strategy(model, dims, std::move(split), o.zero, o.adam);
}

}  // namespace shardlm::parallel
