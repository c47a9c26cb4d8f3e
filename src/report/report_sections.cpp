// Report sections that are tables and notes rather than charts: the per-rank memory table (from the
// memory_peak_rss.* / memory_device_peak_allocated.* keys, observe/rank_memory.h) and the note that
// metrics.jsonl ended in a cut record. Kept apart from the charts (report_charts.cpp).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "observe/rank_memory.h"
#include "report/report.h"

namespace shardlm::observe {
namespace {

std::string mb(double bytes) {
  if (!std::isfinite(bytes)) return "–";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

// Largest finite value of a column (NaN when none).
double column_max(const RunData& run, const std::string& name) {
  double best = NAN;
  for (double v : run.column(name))
    if (std::isfinite(v) && !(v <= best)) best = v;
  return best;
}

}  // namespace

std::string cut_metrics_note(const RunData& run) {
  if (run.cut_last_line == 0) return "";
  return "<p class=\"note\" id=\"metrics-cut\"><b>metrics.jsonl was cut:</b> its last line (line " +
         std::to_string(run.cut_last_line) +
         ") is an unfinished record (the run was killed, or the disk filled, while writing it) and is left out; "
         "the charts show the " + std::to_string(run.steps.size()) + " complete records before it.</p>\n";
}

std::string restarts_table(const RunData& run) {
  if (run.restarts.empty()) return "";
  std::string o = "<p class=\"note\" id=\"restarts\"><b>Elastic restarts</b> (restarts.jsonl): the job failed and "
                  "the launcher restarted it from its newest checkpoint " + std::to_string(run.restarts.size()) +
                  " time(s); metrics after a restart carry <code>restarts</code>.</p>\n<table class=\"comm\"><tr>"
                  "<th>restart</th><th>exit status</th><th>ranks before</th><th>ranks after</th><th>resumed after step</th>"
                  "</tr>";
  for (const auto& r : run.restarts) {
    auto field = [&](const char* k) { return r.contains(k) ? r[k].dump() : std::string("-"); };
    o += "<tr><td>" + field("restart") + "</td><td>" + field("exit_status") + "</td><td>" + field("ranks_before") +
         "</td><td>" + field("ranks") + "</td><td>" + field("resume_step") + "</td></tr>";
  }
  return o + "</table>\n";
}

std::string memory_per_rank_table(const RunData& run) {
  const std::string rss = kPeakRss, gpu = kDevicePeakAllocated;
  int ranks = 0;
  while (run.has(rss + ".rank" + std::to_string(ranks))) ++ranks;
  if (ranks == 0) return "";
  const bool device = run.has(gpu + ".rank0");
  std::ostringstream o;
  o << "<h2 style=\"font-size:16px\">Memory per rank</h2><table class=\"comm\" id=\"memory-per-rank\"><tr><th>rank</th>"
       "<th>peak RSS (max over steps)</th><th>peak RSS (last step)</th>";
  if (device) o << "<th>GPU peak allocated (max over steps)</th>";
  o << "</tr>";
  double lo = INFINITY, hi = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::string key = rss + ".rank" + std::to_string(r);
    const double peak = column_max(run, key);
    lo = std::min(lo, peak);
    hi = std::max(hi, peak);
    const auto& col = run.column(key);
    o << "<tr><td>" << r << "</td><td>" << mb(peak) << "</td><td>" << mb(col.back()) << "</td>";
    if (device) o << "<td>" << mb(column_max(run, gpu + ".rank" + std::to_string(r))) << "</td>";
    o << "</tr>";
  }
  char line[256];
  std::snprintf(line, sizeof line, "%.3f", lo > 0 ? hi / lo : 1.0);
  o << "</table><p class=\"note\" id=\"memory-imbalance\">Imbalance across ranks (largest / smallest peak RSS over "
       "the run): <b>"
    << line << "</b> (" << mb(hi) << " / " << mb(lo) << "); worst step: ";
  std::snprintf(line, sizeof line, "%.3f", column_max(run, rss + "_imbalance"));
  o << line;
  if (device) {
    std::snprintf(line, sizeof line, "%.3f", column_max(run, gpu + "_imbalance"));
    o << "; GPU peak allocated, worst step: " << line;
  }
  o << ". Each rank's peak of every step, gathered to the logging rank (metrics.jsonl <code>" << rss
    << ".rank&lt;r&gt;</code>).</p>\n";
  return o.str();
}

}  // namespace shardlm::observe
