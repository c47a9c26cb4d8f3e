// See rank_memory.h.
#include "observe/rank_memory.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "util/device.h"
#include "util/process_memory.h"

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

void gather_rank_memory(comm::Communicator& world, c10::Device device, StepMetrics& m) {
  const int n = world.size();
  const auto mine = at::tensor({static_cast<double>(peak_resident_bytes()),
                                static_cast<double>(device_memory(device).peak_allocated)}, at::kDouble);
  auto all = at::empty({2 * n}, at::kDouble);
  world.all_gather(mine, all);
  std::vector<double> rss(n), gpu(n);
  for (int r = 0; r < n; ++r) {
    rss[r] = all[2 * r].item<double>();
    gpu[r] = all[2 * r + 1].item<double>();
  }
  record_rank_memory(kPeakRss, rss, m);
  if (device.is_cuda()) record_rank_memory(kDevicePeakAllocated, gpu, m);
}

void record_comm_stats(const comm::Communicator& c, const std::string& prefix, StepMetrics& m) {
  for (const auto& [op, st] : c.stats()) {
    m.extra[prefix + op + "_bytes"] += static_cast<double>(st.bytes);
    m.extra[prefix + op + "_wait_s"] += st.wait_seconds;
    m.extra[prefix + op + "_inflight_s"] += st.inflight_seconds;
  }
}

}  // namespace shardlm::observe
