// Which consecutive units each pipeline stage runs: the embedding on the first stage, the final norm
// and head on the last, the decoder layers split into p runs of consecutive layers. The planner
// costs every decoder layer the same, so the default split is even, with the remainder on the
// middle stages (the first and last also run the embedding and the head).
// parallelism.pipeline_split (layer counts per stage) overrides it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardlm::parallel::pp {

struct StageUnits {
  size_t first = 0, last = 0;  // unit range [first, last] (0 = embedding, L + 1 = head)
};

// Layer counts per stage: `split` when given (checked: p entries >= 1 summing to the layers),
// else the balanced default. Refuses p > layers, naming the numbers.
std::vector<int64_t> layer_counts(int64_t layers, int stages, const std::vector<int64_t>& split);

// The unit range of `stage` from the layer counts.
StageUnits stage_units(const std::vector<int64_t>& counts, int stage);

}  // namespace shardlm::parallel::pp
