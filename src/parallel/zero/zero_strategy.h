// The Strategy for ZeRO stages 1-3 and mixed-precision stage 0: the ZeRO engine (zero_engine.h)
// over the data-parallel group, packing the parameters the model holds (tensor-parallel shards
// when `tp` is set) into its flat units.
#pragma once
#include <memory>

#include "optim/adamw.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"
#include "parallel/zero/zero_engine.h"

namespace shardlm::parallel {

std::unique_ptr<Strategy> make_zero_strategy(model::Llama& model, const ParallelDims& dims,
                                             std::shared_ptr<TensorParallel> tp, ZeroOptions options,
                                             const optim::AdamWOptions& adam);

}  // namespace shardlm::parallel
