// See rank_memory.h.
#include "observe/rank_memory.h"

#include <algorithm>
#include <numeric>

namespace shardlm::observe {

void record_rank_memory(const std::string& kind, const std::vector<double>& per_rank, StepMetrics& m) {
  if (per_rank.empty()) return;
  for (size_t r = 0; r < per_rank.size(); ++r) m.extra[kind + ".rank" + std::to_string(r)] = per_rank[r];
  const auto [lo, hi] = std::minmax_element(per_rank.begin(), per_rank.end());
  m.extra[kind + "_max"] = *hi;
  m.extra[kind + "_min"] = *lo;
  m.extra[kind + "_mean"] = std::accumulate(per_rank.begin(), per_rank.end(), 0.0) / per_rank.size();
  m.extra[kind + "_imbalance"] = *lo > 0 ? *hi / *lo : 1.0;
}

}  // namespace shardlm::observe
