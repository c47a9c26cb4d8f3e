// Which consecutive units each pipeline stage runs: the embedding on the first stage, the final norm
// and head on the last, the decoder layers split into p runs of consecutive layers. The default split
// balances compute: it minimises the largest stage's cost, a decoder layer costing its matrix
// products and the head its vocabulary product plus the cross-entropy (the head of a small model
// with a large vocabulary outweighs several layers). Attention's score products are left out (about
// 4% of a layer at seq_len 2048 for a 7B shape), so the split depends on the model alone and the
// planner and the trainer agree on it. Among equally balanced splits it keeps the even one, with the
// remainder on the middle stages.
// parallelism.pipeline_split (layer counts per stage) overrides it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/llama_config.h"

namespace shardlm::parallel::pp {

// Floating-point operations of one token's forward through each kind of unit (the backward costs
// about twice as much for every unit alike, so the forward's proportions are the step's).
struct UnitCosts {
  double embedding = 0, layer = 0, head = 0;
};
UnitCosts unit_costs(const model::LlamaConfig& model);

// Layer counts per stage: `split` when given (checked: p entries >= 1 summing to the layers),
// else the compute-balanced default. Refuses p > layers, naming the numbers.
std::vector<int64_t> layer_counts(const model::LlamaConfig& model, int stages, const std::vector<int64_t>& split);

struct StageUnits {
  size_t first = 0, last = 0;  // unit range [first, last] (0 = embedding, L + 1 = head)
};

// The default split for per-unit costs: the largest stage's cost minimised.
std::vector<int64_t> balanced_layer_counts(int64_t layers, int stages, const UnitCosts& costs);
// The cost of each stage under `counts`.
std::vector<double> stage_costs(const std::vector<int64_t>& counts, const UnitCosts& costs);

// The unit range of `stage` from the layer counts.
StageUnits stage_units(const std::vector<int64_t>& counts, int stage);

}  // namespace shardlm::parallel::pp
