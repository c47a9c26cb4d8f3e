// The Strategy for fp32 (and fp64) stage 0: every rank of the data-parallel group holds what the
// model split leaves it (the whole model, a TP shard, a pipeline stage) and a replicated AdamW over
// it; gradients are all-reduced in buckets during backward (data_parallel.h).
#pragma once
#include <memory>

#include "optim/adamw.h"
#include "parallel/model_split.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"

namespace shardlm::parallel {

// `model`'s parameters must already be on their device.
std::unique_ptr<Strategy> make_ddp_strategy(model::Llama& model, const ParallelDims& dims, ModelSplit split,
                                            int64_t bucket_bytes, const optim::AdamWOptions& adam);

}  // namespace shardlm::parallel
