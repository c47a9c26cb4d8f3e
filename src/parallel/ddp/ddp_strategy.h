// The Strategy for fp32 (and fp64) stage 0: every rank of the data-parallel group holds the whole
// model (or its tensor-parallel shard) and a replicated AdamW; gradients are all-reduced in
// buckets during backward (data_parallel.h).
#pragma once
#include <memory>

#include "optim/adamw.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"

namespace shardlm::parallel {

// `model`'s parameters must already be on their device; `tp` may be null (no tensor parallelism).
std::unique_ptr<Strategy> make_ddp_strategy(model::Llama& model, const ParallelDims& dims,
                                            std::shared_ptr<TensorParallel> tp, int64_t bucket_bytes,
                                            const optim::AdamWOptions& adam);

}  // namespace shardlm::parallel
