// See stage_split.h.
#include "parallel/pipeline/stage_split.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "util/error.h"

namespace shardlm::parallel::pp {

std::vector<int64_t> layer_counts(int64_t layers, int stages, const std::vector<int64_t>& split) {
  if (stages < 1) fail("parallelism.pipeline_parallel must be >= 1, got ", stages);
  if (!split.empty()) {
    std::string list;
    for (auto c : split) list += (list.empty() ? "" : ", ") + std::to_string(c);
    const int64_t sum = std::accumulate(split.begin(), split.end(), int64_t{0});
    if (static_cast<int>(split.size()) != stages || sum != layers ||
        std::any_of(split.begin(), split.end(), [](int64_t c) { return c < 1; }))
      fail("parallelism.pipeline_split [", list, "] must hold ", stages, " layer counts (one per pipeline stage), each "
           ">= 1, summing to the model's ", layers, " layers; it has ", split.size(), " summing to ", sum);
    return split;
  }
  if (stages > layers)
    fail("parallelism.pipeline_parallel=", stages, " exceeds the model's ", layers,
         " decoder layers: every stage needs at least one; use at most ", layers, " stages");
  std::vector<int64_t> counts(stages, layers / stages);
  // The remainder (fewer than `stages` layers, one each) goes to the middle stages first: the first
  // stage also runs the embedding and the last the head.
  std::vector<int> order;
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (int64_t i = 0; i < layers % stages; ++i) counts[order[i]] += 1;
  return counts;
}

StageUnits stage_units(const std::vector<int64_t>& counts, int stage) {
  int64_t before = 0;
  for (int s = 0; s < stage; ++s) before += counts[s];
  const int64_t layers = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  StageUnits u;
  u.first = stage == 0 ? 0 : static_cast<size_t>(1 + before);
  u.last = stage == static_cast<int>(counts.size()) - 1 ? static_cast<size_t>(layers + 1)
                                                        : static_cast<size_t>(before + counts[stage]);
  return u;
}

}  // namespace shardlm::parallel::pp
