// See parallelize.h.
#include "parallel/parallelize.h"

#include "parallel/ddp/ddp_strategy.h"
#include "parallel/tensor/tensor_parallel.h"
#include "parallel/zero/zero_strategy.h"

namespace shardlm::parallel {

std::unique_ptr<Strategy> parallelize(model::Llama& model, const ParallelDims& dims, const ParallelizeOptions& o) {
  // 1. Tensor parallelism: from here on the model holds this rank's shards.
  std::shared_ptr<TensorParallel> tp;
  if (dims.tp > 1) {
    tp::check_tensor_parallel(model.config(), dims.tp, o.sequence_parallel, 0);
    tp = std::make_shared<TensorParallel>(model, dims.tp_comm, o.sequence_parallel);
  }
  // 2. Activation checkpointing.
  model.set_recompute(o.recompute);
  // 3. Data parallelism over this position's data-parallel group.
  const auto dtype = o.zero.compute_dtype;
  if (o.zero.stage == 0 && (dtype == at::kFloat || dtype == at::kDouble)) {
    model.to(o.zero.device);
    return make_ddp_strategy(model, dims, tp, o.ddp_bucket_bytes, o.adam);
  }
  return make_zero_strategy(model, dims, tp, o.zero, o.adam);
}

}  // namespace shardlm::parallel
