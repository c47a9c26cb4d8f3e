// See timeline.h.
#include "parallel/pipeline/timeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "util/error.h"

namespace shardlm::parallel::pp {
at::Tensor pack_events(const StageTimes& times, int64_t rows) {
  if (static_cast<int64_t>(times.events.size()) > rows)
    fail("pipeline timeline: ", times.events.size(), " events for ", rows, " rows");
  auto block = at::full({rows, kEventColumns}, -1.0, at::kDouble);
  auto a = block.accessor<double, 2>();
  for (size_t i = 0; i < times.events.size(); ++i) {
    const auto& e = times.events[i];
    a[i][0] = e.kind;
    a[i][1] = static_cast<double>(e.micro);
    a[i][2] = e.start_s;
    a[i][3] = e.end_s;
    a[i][4] = e.chunk;
  }
  return block;
}

nlohmann::json timeline_json(const at::Tensor& gathered, int stages, int64_t micro, int64_t step,
                             const std::vector<double>& bubbles, int64_t rows, const std::string& schedule, int chunks) {
  const auto all = gathered.reshape({stages, rows, kEventColumns}).contiguous();
  auto a = all.accessor<double, 3>();
  double origin = std::numeric_limits<double>::infinity();
  for (int s = 0; s < stages; ++s)
    for (int64_t i = 0; i < rows; ++i)
      if (a[s][i][0] >= 0) origin = std::min(origin, a[s][i][2]);
  nlohmann::json out = {{"step", step},
                        {"micro_batches", micro},
                        {"schedule", schedule},
                        {"chunks", chunks},
                        {"bubble_formula", schedule_bubble(parse_schedule(schedule), stages, micro, chunks)},
                        {"stages", nlohmann::json::array()}};
  for (int s = 0; s < stages; ++s) {
    nlohmann::json events = nlohmann::json::array();
    for (int64_t i = 0; i < rows; ++i) {
      if (a[s][i][0] < 0) continue;
      events.push_back({event_name(static_cast<int>(a[s][i][0])), static_cast<int64_t>(a[s][i][1]),
                        a[s][i][2] - origin, a[s][i][3] - origin, static_cast<int>(a[s][i][4])});
    }
    out["stages"].push_back({{"stage", s}, {"bubble", s < static_cast<int>(bubbles.size()) ? bubbles[s] : 0.0},
                             {"events", std::move(events)}});
  }
  return out;
}

}  // namespace shardlm::parallel::pp
