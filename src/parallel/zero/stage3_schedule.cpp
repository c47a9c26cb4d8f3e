// See stage3_schedule.h.
#include "parallel/zero/stage3_schedule.h"

#include <algorithm>

namespace shardlm::parallel {

bool stage3_sharded(const FlatUnit& unit, double persistence_threshold) {
  return unit.numel > 0 && static_cast<double>(unit.padded_numel) >= persistence_threshold;
}

std::vector<size_t> stage3_prefetch_window(const FlatLayout& layout, size_t from, int direction, double prefetch_numel,
                                           double persistence_threshold) {
  std::vector<size_t> window;
  double ahead = 0;  // elements of the window so far
  const auto n = static_cast<int64_t>(layout.units.size());
  for (int64_t v = static_cast<int64_t>(from) + direction; v >= 0 && v < n && ahead < prefetch_numel; v += direction) {
    const auto& unit = layout.units[v];
    if (unit.numel == 0) break;  // the end of this pipeline stage's units
    if (!stage3_sharded(unit, persistence_threshold)) continue;
    ahead += static_cast<double>(unit.padded_numel);
    window.push_back(static_cast<size_t>(v));
  }
  return window;
}

std::vector<char> stage3_units_kept_for_backward(const FlatLayout& layout, double prefetch_numel,
                                                 double persistence_threshold) {
  const auto& units = layout.units;
  std::vector<char> kept(units.size(), 0);
  size_t end = units.size();
  while (end > 0 && units[end - 1].numel == 0) --end;  // other pipeline stages' units are empty
  if (end == 0) return kept;
  const size_t last = end - 1;
  kept[last] = 1;
  for (size_t v : stage3_prefetch_window(layout, last, -1, prefetch_numel, persistence_threshold)) kept[v] = 1;
  return kept;
}

std::vector<size_t> stage3_gradients_complete_at(const FlatLayout& layout, size_t first, size_t last) {
  std::vector<size_t> complete_at(layout.units.size(), layout.units.size());
  for (size_t u = last + 1; u-- > first;) {
    complete_at[u] = u;
    for (size_t o : layout.units[u].also_reads) complete_at[o] = std::min(complete_at[o], u);
  }
  return complete_at;
}

int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold,
                                   size_t first, size_t last, int forwards_in_flight) {
  const auto& units = layout.units;
  const auto kept = stage3_units_kept_for_backward(layout, prefetch_numel, persistence_threshold);
  std::vector<char> gathered(units.size(), 0);
  int64_t now = 0, peak = 0;
  auto sharded = [&](size_t v) { return stage3_sharded(units[v], persistence_threshold); };
  auto gather = [&](size_t v) {
    if (!sharded(v) || gathered[v]) return;
    gathered[v] = 1;
    now += units[v].padded_numel;
    peak = std::max(peak, now);
  };
  auto release = [&](size_t v) {
    if (!sharded(v) || !gathered[v]) return;
    gathered[v] = 0;
    now -= units[v].padded_numel;
  };
  auto enter = [&](size_t u, int direction) {
    gather(u);
    for (size_t o : units[u].also_reads) gather(o);
    for (size_t v : stage3_prefetch_window(layout, u, direction, prefetch_numel, persistence_threshold)) gather(v);
  };
  const auto complete_at = stage3_gradients_complete_at(layout, first, last);
  for (int f = 0; f < std::max(1, forwards_in_flight); ++f) {
    for (size_t u = first; u <= last; ++u) {
      enter(u, +1);
      if (kept[u]) continue;
      release(u);
      for (size_t o : units[u].also_reads) release(o);
    }
  }
  for (size_t u = last + 1; u-- > first;) {
    enter(u, -1);
    for (size_t v = 0; v < units.size(); ++v)
      if (complete_at[v] == u) release(v);
  }
  return peak;
}

int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold) {
  if (layout.units.empty()) return 0;
  return stage3_gathered_peak_numel(layout, prefetch_numel, persistence_threshold, 0, layout.units.size() - 1);
}

}  // namespace shardlm::parallel
