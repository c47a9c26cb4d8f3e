// The Strategy for ZeRO stages 1-3 and mixed-precision stage 0: the ZeRO engine (zero_engine.h)
// over the data-parallel group, packing the parameters the model holds (tensor-parallel shards
// under TP) into its flat units. Pipeline stages are not combined with it yet.
#pragma once
#include <memory>

#include "optim/adamw.h"
#include "parallel/model_split.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"
#include "parallel/zero/zero_engine.h"

namespace shardlm::parallel {

std::unique_ptr<Strategy> make_zero_strategy(model::Llama& model, const ParallelDims& dims, ModelSplit split,
                                             ZeroOptions options, const optim::AdamWOptions& adam);

}  // namespace shardlm::parallel
