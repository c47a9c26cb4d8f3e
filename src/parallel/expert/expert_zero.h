// ZeRO 1-3 with expert parallelism (expert_parallel.h). The expert slices and everything else are
// data-parallel over different groups: the replicated parameters over all dp ranks, each expert
// slice over the dp/ep ranks holding it (edp). Rather than teach one ZeRO engine two groups, two
// engines are built side by side over the same model, each packing its own parameters into the
// model's units (ZeroOptions::only_params; a unit may be empty in one of them):
//   dense   over dp (or the shard group), gradients averaged over dp, as without EP;
//   experts over edp, its reduced gradients divided by dp (ZeroOptions::average_over: each owner's
//           gradient already sums its EP group's rows), its optimizer segments named by their
//           element range in the whole expert tensor (so checkpoints reshard to another ep).
// The strategy drives both in the same order on every rank: both engines' unit hooks around each
// unit (stage 3 gathers both halves of a layer), both reductions, one gradient norm (each engine's
// sum of squares, weighted by ModelSplit so replicated tensors count once over the EP group), both
// updates, and one checkpoint view per engine.
#pragma once
#include <memory>

#include "parallel/model_split.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"
#include "parallel/zero/zero_engine.h"

namespace shardlm::parallel {

// split.ep must be set. Refuses per-unit loss scaling (each engine would rescale the backward
// signal at every unit boundary).
std::unique_ptr<Strategy> make_expert_zero_strategy(model::Llama& model, const ParallelDims& dims, const ModelSplit& split,
                                                    const ZeroOptions& options, const optim::AdamWOptions& adam);

}  // namespace shardlm::parallel
