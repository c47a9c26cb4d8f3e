// diagnose (diagnosis.h): medians of the measured phases, the prediction beside them, and seed 003's
// order of what to look at.
#include "report/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "util/units.h"

namespace shardlm::observe {
namespace {

// Median of a column over the steps after the first two (all steps when the run has three or fewer).
double steady_median(const RunData& run, const std::string& name) {
  const auto col = run.column(name);
  std::vector<double> v;
  const size_t skip = col.size() > 3 ? 2 : 0;
  for (size_t i = skip; i < col.size(); ++i)
    if (std::isfinite(col[i])) v.push_back(col[i]);
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double exposed_comm(const RunData& run) {
  double s = 0;
  for (const auto& [name, col] : run.columns)
    if (name.rfind("comm_", 0) == 0 && name.size() > 7 && name.compare(name.size() - 7, 7, "_wait_s") == 0) {
      const double m = steady_median(run, name);
      if (std::isfinite(m)) s += m;
    }
  return s;
}

double predicted(const RunData& run, const char* key) {
  if (!run.plan || !run.plan->contains("predicted")) return -1;
  const auto& p = (*run.plan)["predicted"];
  return p.contains(key) ? p[key].get<double>() : -1;
}

// device_memory from train_config.json: bytes, or a size such as "32GB"; 0 when absent or 0. A value
// it cannot read (not a size, negative) sets `unreadable` to the reason, naming the value, and gives 0.
double device_memory(const RunData& run, std::string& unreadable) {
  if (!run.config || !run.config->contains("device_memory")) return 0;
  const auto& v = (*run.config)["device_memory"];
  if (v.is_null()) return 0;
  std::string why;
  double bytes = 0;
  if (v.is_number()) {
    bytes = v.get<double>();
  } else if (v.is_string()) {
    try {
      bytes = util::parse_bytes(v.get<std::string>());
    } catch (const std::exception& e) {
      why = e.what();
    }
  } else {
    why = std::string("a JSON ") + v.type_name() + ", not bytes or a size";
  }
  if (why.empty() && !(std::isfinite(bytes) && bytes >= 0)) why = "not a size of zero or more bytes";
  if (why.empty()) return bytes;
  unreadable = "memory: device_memory " + v.dump() + " in train_config.json is unreadable (" + why +
               "), so memory against the limit was not checked; write it as bytes or a size such as \"32GB\"";
  return 0;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * x);
  return b;
}

}  // namespace

Diagnosis diagnose(const RunData& run) {
  Diagnosis d;
  const double step = steady_median(run, "step_time_s");
  if (!std::isfinite(step) || step <= 0) return d;
  const double fwd = steady_median(run, "time_forward_s"), bwd = steady_median(run, "time_backward_s");
  const double opt = steady_median(run, "time_optimizer_s"), data = steady_median(run, "time_data_s");
  const double comm = exposed_comm(run);
  auto value = [](double v) { return std::isfinite(v) ? v : 0.0; };
  d.phases = {{"forward", value(fwd), predicted(run, "forward_s")},
              {"backward", value(bwd), predicted(run, "backward_s")},
              {"optimizer", value(opt), predicted(run, "optimizer_s")},
              {"communication (exposed)", comm, predicted(run, "comm_exposed_s")},
              {"data", value(data), -1},
              {"step", step, predicted(run, "step_s")}};
  char line[400];
  // 1. The device idle on data.
  if (value(data) > 0.05 * step) {
    std::snprintf(line, sizeof line,
                  "data: assembling batches takes %s of the step (%.3f s): turn on data.prefetch, or prepare the "
                  "corpus into token files once instead of reading text",
                  pct(data / step).c_str(), data);
    d.findings.push_back(line);
  }
  // 2. The device idle on communication.
  if (comm > 0.30 * step) {
    std::snprintf(line, sizeof line,
                  "communication: ranks wait %s of the step (%.3f s) for collectives not hidden under compute: raise "
                  "zero_optimization.reduce_bucket_size / allgather_bucket_size, keep overlap_comm on, use a lower "
                  "ZeRO stage (stage 3 moves 1.5x the bytes of stage 2) or fewer tensor-parallel ranks, or hybrid "
                  "sharding (parallelism.hybrid_shard) to keep gathers within a node",
                  pct(comm / step).c_str(), comm);
    d.findings.push_back(line);
  }
  // 3. Memory near the limit.
  std::string unreadable;
  const double limit = device_memory(run, unreadable), peak = steady_median(run, "memory_peak_rss_max");
  if (!unreadable.empty()) d.findings.push_back(unreadable);
  if (limit > 0 && std::isfinite(peak) && peak > 0.9 * limit) {
    std::snprintf(line, sizeof line,
                  "memory: the peak resident set is %s of device_memory (%s of %s): activation_checkpointing.mode "
                  "selective or full, or a smaller micro-batch with more accumulation, before the next change "
                  "pushes it over",
                  pct(peak / limit).c_str(), util::format_bytes(peak).c_str(), util::format_bytes(limit).c_str());
    d.findings.push_back(line);
  }
  // 4. The prediction: the phase furthest from it.
  const PhaseComparison* worst = nullptr;
  double worst_gap = 0;
  for (const auto& p : d.phases) {
    if (p.predicted_s <= 0 || p.phase == "step" || p.measured_s < 0.05 * step) continue;
    const double gap = std::abs(std::log(p.measured_s / p.predicted_s));
    if (gap > worst_gap) worst_gap = gap, worst = &p;
  }
  if (worst && worst_gap > std::log(1.15)) {
    std::snprintf(line, sizeof line,
                  "prediction: %s took %.3f s, %.2fx the %.3f s the machine profile predicts: %s", worst->phase.c_str(),
                  worst->measured_s, worst->measured_s / worst->predicted_s, worst->predicted_s,
                  worst->measured_s > worst->predicted_s
                      ? "something else ran on these cores, or the profile was measured with other threads or ranks "
                        "per node (re-run `shardlm bench machine` as this run runs)"
                      : "the profile was measured on a busier machine or with fewer threads; re-measure it");
    d.findings.push_back(line);
  }
  // 5. Otherwise compute-bound.
  if (d.findings.empty()) {
    const double compute = value(fwd) + value(bwd);
    std::snprintf(line, sizeof line,
                  "compute: forward + backward are %s of the step; what is left is the processor's rate at these "
                  "shapes (a larger micro-batch gives larger products; bf16 where the processor has bf16 dot products)",
                  pct(compute / step).c_str());
    d.findings.push_back(line);
  }
  return d;
}

std::string diagnosis_section(const RunData& run) {
  const auto d = diagnose(run);
  std::ostringstream out;
  out << "<section class=\"panel\" id=\"diagnosis\"><h2>Diagnosis</h2>";
  if (d.phases.empty()) {
    out << "<p>no step_time_s in metrics.jsonl</p></section>";
    return out.str();
  }
  out << "<table><tr><th>phase</th><th>measured s / step</th><th>predicted s</th><th>measured / predicted</th></tr>";
  char row[256];
  for (const auto& p : d.phases) {
    if (p.predicted_s > 0)
      std::snprintf(row, sizeof row, "<tr><td>%s</td><td>%.4f</td><td>%.4f</td><td>%.2f</td></tr>", p.phase.c_str(),
                    p.measured_s, p.predicted_s, p.measured_s / p.predicted_s);
    else
      std::snprintf(row, sizeof row, "<tr><td>%s</td><td>%.4f</td><td>–</td><td>–</td></tr>", p.phase.c_str(), p.measured_s);
    out << row;
  }
  out << "</table><ol>";
  for (const auto& f : d.findings) out << "<li>" << f << "</li>";
  out << "</ol><p class=\"note\">Medians over the steps after the first two. Exposed communication is the sum of "
         "<code>comm_&lt;op&gt;_wait_s</code>; predictions are plan.json's <code>predicted</code>, present when the "
         "run was given <code>machine_profile</code> (a <code>shardlm bench machine</code> profile). Findings follow "
         "seed 003's order: data, communication over 30% of the step, memory over 90% of device_memory, the phase "
         "furthest from its prediction, else compute.</p></section>";
  return out.str();
}

}  // namespace shardlm::observe
