// The report's resource charts (report.h): memory per rank against plan.json, time per step split
// into compute and exposed communication, and communication volume per collective. Kept apart from
// the training curves (report_charts.cpp) because they read the plan and the comm_* columns.
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "report/report_chart_pieces.h"
#include "report/report_internal.h"
#include "report/svg_chart.h"
#include "util/units.h"

namespace shardlm::observe {

using namespace svg;  // the chart kit (report/svg_chart.h)

namespace {

using nlohmann::json;

const char* const kOps[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"};

// Ops present in metrics.jsonl: the five named ones first, then any other comm_<op>_bytes/_wait_s.
std::vector<std::string> comm_ops(const RunData& run) {
  std::vector<std::string> ops;
  for (const char* op : kOps)
    if (run.columns.count(std::string("comm_") + op + "_bytes") || run.columns.count(std::string("comm_") + op + "_wait_s"))
      ops.push_back(op);
  for (const auto& [k, v] : run.columns) {
    const std::string suffix = k.size() > 7 && k.compare(k.size() - 7, 7, "_wait_s") == 0 ? "_wait_s"
                               : k.size() > 6 && k.compare(k.size() - 6, 6, "_bytes") == 0 ? "_bytes" : "";
    if (k.rfind("comm_", 0) != 0 || suffix.empty()) continue;
    const std::string op = k.substr(5, k.size() - 5 - suffix.size());
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  return ops;
}


const char* const kMemoryCategories[] = {"compute_params", "gradients",    "master_params", "optimizer_states",
                                         "activations",    "comm_buffers", "gathered_peak"};

// The object in plan.json holding per-rank bytes by category, for the run's ZeRO stage: an element
// of "stages" (what `shardlm plan` writes: one object per stage) whose "stage" matches, else the top
// level or the first member object that has any category as a number. `where` says which was used.
const json* plan_memory(const json& plan, double run_stage, std::string& where) {
  auto has_category = [](const json& j) {
    if (!j.is_object()) return false;
    for (const char* c : kMemoryCategories)
      if (j.contains(c) && j[c].is_number()) return true;
    return j.contains("total") && j["total"].is_number();
  };
  if (plan.contains("stages") && plan["stages"].is_array()) {
    const auto& stages = plan["stages"];
    for (size_t i = 0; i < stages.size(); ++i)
      if (has_category(stages[i]) && stages[i].contains("stage") && stages[i]["stage"].is_number() &&
          stages[i]["stage"].get<double>() == run_stage) {
        where = "stages[" + std::to_string(i) + "], stage " + num(run_stage, 10);
        return &stages[i];
      }
    if (stages.size() == 1 && has_category(stages[0])) {
      where = "its only entry in stages, stage " + (stages[0].contains("stage") ? stages[0]["stage"].dump() : "?");
      return &stages[0];
    }
    where = "no entry in stages for stage " + num(run_stage, 10);
    return nullptr;
  }
  if (has_category(plan)) {
    where = "top level";
    return &plan;
  }
  if (plan.is_object())
    for (auto it = plan.begin(); it != plan.end(); ++it)
      if (has_category(it.value())) {
        where = "\"" + it.key() + "\"";
        return &it.value();
      }
  where = "none of the categories as numbers";
  return nullptr;
}

}  // namespace

using report_detail::config_text;
using report_detail::section;
using report_detail::step_axis;

std::string chart_memory(const RunData& run) {
  const std::string id = "chart-memory", title = "Memory per rank";
  if (!run.memory)
    return section(empty_chart(id, title, "no memory.json in the run directory"),
                   "memory.json is written by rank 0 when training starts; this run directory has none.");
  const json& mem = *run.memory;
  auto value = [](const json* j, const char* key) {
    return j && j->contains(key) && (*j)[key].is_number() ? (*j)[key].get<double>() : kNaN;
  };
  double stage = value(&mem, "stage");
  if (!std::isfinite(stage)) stage = std::atof(config_text(run.config, "/zero_optimization/stage").c_str());
  std::string plan_where;
  const json* plan = run.plan ? plan_memory(*run.plan, stage, plan_where) : nullptr;

  std::vector<Category> cats;
  std::vector<double> measured, planned;
  bool activations_measured = false;
  for (size_t c = 0; c < std::size(kMemoryCategories); ++c) {
    const std::string k = kMemoryCategories[c];
    double m = value(&mem, k.c_str());
    if (k == "activations" && !std::isfinite(m)) {
      m = value(&mem, "activations_measured");  // the trainer's RSS measurement of the first step
      activations_measured = std::isfinite(m);
    }
    const double pl = value(plan, k.c_str());
    if (!(m > 0) && !(pl > 0)) continue;  // neither measured nor planned bytes (e.g. no master copy in fp32)
    cats.push_back({std::isfinite(m) ? k : k + " (not measured)", kPalette[c]});
    measured.push_back(m);
    planned.push_back(pl);
  }
  const double dp = value(&mem, "dp_size");
  const std::string ranks = std::isfinite(dp) ? num(dp, 10) : "?";
  auto total_of = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v)
      if (std::isfinite(x)) t += x;
    return t;
  };
  std::vector<Stack> stacks;
  stacks.push_back({"measured, each of " + ranks + " ranks", measured, bytes_label(total_of(measured))});
  Stack ps{"plan.json", planned, ""};
  if (plan) {
    ps.top_label = bytes_label(total_of(planned));
    const double t = value(plan, "total");
    if (std::isfinite(t) && std::fabs(t - total_of(planned)) > 0.5) {
      ps.marker = t;
      ps.marker_label = "plan total " + bytes_label(t);
    }
  } else {
    ps.values.clear();
    ps.placeholder = run.plan ? "plan.json: " + plan_where : "no plan.json";
  }
  stacks.push_back(ps);
  AxisSpec y;
  y.title = "bytes per rank";
  y.label = bytes_label;
  y.binary = true;
  const std::string svg = stacked_bar_chart(id, title, cats, stacks, y, "", {}, "");

  std::ostringstream note;
  note << "Measured: <code>memory.json</code> (ZeRO stage " << num(stage, 10) << ", "
       << esc(mem.value("compute_dtype", std::string("?"))) << " compute, " << ranks
       << " data-parallel ranks): bytes rank 0 holds; every rank holds the same (replicas at stage 0, equal padded "
          "partitions at stages 1–3). Categories that are zero both measured and planned are left out. compute_params + gradients + master_params + optimizer_states = total_model_states ("
       << bytes_label(value(&mem, "total_model_states"))
       << ")"
       << (value(&mem, "gathered_peak") > 0 ? "; gathered_peak (stage 3: peak bytes of gathered units, freed after use) is "
                                              "stacked on top"
                                            : "")
       << ".";
  if (activations_measured)
    note << " activations: <code>activations_measured</code>, the growth of rank 0's resident-set peak over the "
            "first micro-step's forward and backward.";
  else
    note << " Activations and communication buffers are not measured by this run.";
  if (plan) {
    note << " Plan: <code>plan.json</code> (" << esc(plan_where) << ")";
    std::vector<std::string> facts;
    for (const char* k : {"precision", "dp", "micro_batch", "seq_len", "accumulation", "recompute"})
      if (run.plan->contains(k) && !(*run.plan)[k].is_object() && !(*run.plan)[k].is_array())
        facts.push_back(std::string(k) + " " + ((*run.plan)[k].is_string() ? (*run.plan)[k].get<std::string>()
                                                                           : (*run.plan)[k].dump()));
    if (!facts.empty()) {
      note << ", planned for";
      for (size_t i = 0; i < facts.size(); ++i) note << (i ? ", " : " ") << esc(facts[i]);
    }
    note << "; the stacked sum is the planned total"
         << (std::isfinite(value(plan, "total")) ? " (a dashed line marks plan.json's own total where it differs)" : "")
         << ".";
  } else if (run.plan) {
    note << " <code>plan.json</code> is present but no planned bars could be drawn from it (" << esc(plan_where)
         << "): the report looks for the categories compute_params, gradients, master_params, optimizer_states, "
            "activations, comm_buffers, gathered_peak, total as numbers, in the <code>stages</code> entry whose "
            "<code>stage</code> is the run's, or at the top level.";
  } else {
    note << " No <code>plan.json</code> in the run directory, so no planned bars.";
  }
  return section(svg, note.str());
}

std::string chart_step_time(const RunData& run) {
  const std::string id = "chart-step-time", title = "Time per step: compute vs exposed communication";
  const auto st = run.column("step_time_s");
  if (!run.has("step_time_s"))
    return section(empty_chart(id, title, "no step_time_s in metrics.jsonl"), "");
  std::vector<std::string> ops;
  for (const auto& op : comm_ops(run))
    if (run.has("comm_" + op + "_wait_s")) ops.push_back(op);
  // Overlapped communication: a collective in flight (launch to observed completion,
  // comm_<op>_inflight_s) minus the time rank 0 waited for it, summed over operations and capped at
  // the compute time it overlapped. Older runs without inflight columns show it as not recorded.
  bool have_inflight = !ops.empty();
  for (const auto& op : ops) have_inflight = have_inflight && run.has("comm_" + op + "_inflight_s");
  std::vector<Category> cats{{"compute (step − exposed comm)", "#4c78a8"}};
  if (have_inflight) cats = {{"compute alone", "#4c78a8"}, {"compute with comm in flight (overlapped)", "#72b7b2"}};
  // Assembling batches (time_data_s; runs from before it was recorded have none).
  const bool have_data = run.has("time_data_s");
  const auto data_s = run.column("time_data_s");
  const size_t data_cat = cats.size();
  if (have_data) cats.push_back({"data loading", "#54a24b"});
  const size_t first_op = cats.size();
  const char* comm_colors[] = {"#f58518", "#e45756", "#eeca3b", "#b279a2", "#9d755d", "#ff9da6"};
  std::vector<std::vector<double>> waits, inflight;
  for (size_t i = 0; i < ops.size(); ++i) {
    cats.push_back({"exposed " + ops[i], comm_colors[i % 6]});
    waits.push_back(run.column("comm_" + ops[i] + "_wait_s"));
    if (have_inflight) inflight.push_back(run.column("comm_" + ops[i] + "_inflight_s"));
  }
  double total_overlap = 0;

  // One stack per step, or per bin of consecutive steps when there are many.
  const size_t n = run.steps.size();
  const size_t k = (n + kMaxBars - 1) / kMaxBars;
  std::vector<Stack> stacks;
  double clipped = 0, total_wait = 0, total_time = 0;
  for (size_t b = 0; b < n; b += k) {
    std::vector<double> vals(cats.size(), 0.0);
    size_t m = 0;
    for (size_t i = b; i < std::min(n, b + k); ++i) {
      if (!std::isfinite(st[i])) continue;
      double wait = 0, overlap = 0;
      for (size_t o = 0; o < ops.size(); ++o) {
        const double w = waits[o][i];
        if (std::isfinite(w)) vals[o + first_op] += w, wait += w;
        if (have_inflight && std::isfinite(inflight[o][i]) && std::isfinite(w)) overlap += std::max(0.0, inflight[o][i] - w);
      }
      if (wait > st[i]) clipped += 1;
      const double data = have_data && std::isfinite(data_s[i]) ? std::min(data_s[i], std::max(0.0, st[i] - wait)) : 0.0;
      if (have_data) vals[data_cat] += data;
      const double compute = std::max(0.0, st[i] - wait - data);
      overlap = std::min(overlap, compute);
      total_overlap += overlap;
      if (have_inflight) vals[1] += overlap;
      vals[0] += compute - (have_inflight ? overlap : 0.0);
      total_wait += wait;
      total_time += st[i];
      ++m;
    }
    if (m == 0) continue;
    for (auto& v : vals) v /= m;
    // Binned bars are labelled by their first step (the tooltip and data-stack carry the range).
    const std::string label = k == 1 ? num(run.steps[b], 10)
                                     : num(run.steps[b], 10) + "–" + num(run.steps[std::min(n, b + k) - 1], 10);
    stacks.push_back({label, vals});
    if (k > 1) stacks.back().axis_label = num(run.steps[b], 10);
  }
  AxisSpec y;
  y.title = "seconds";
  y.label = seconds_label;
  std::vector<LegendItem> extra;
  if (!have_inflight) extra.push_back({"overlapped comm: not recorded", "#999", "hollow"});
  const std::string svg = stacked_bar_chart(id, title, cats, stacks, y, k == 1 ? "optimizer step" : "first step of each bin",
                                            extra, k > 1 ? "bars: mean of " + std::to_string(k) + " steps" : "");
  std::ostringstream note;
  note << "<b>exposed communication</b> = Σ<sub>op</sub> <code>comm_&lt;op&gt;_wait_s</code>: seconds rank 0 was blocked "
          "waiting for a collective during the step (over the run: "
       << seconds_label(total_wait) << " of " << seconds_label(total_time) << ", "
       << num(total_time > 0 ? 100 * total_wait / total_time : kNaN, 3)
       << "%). " << (have_data ? "<b>data loading</b> = <code>time_data_s</code>: assembling the step's batches (and evaluation's). " : "")
       << "<b>compute</b> = <code>step_time_s</code> − exposed communication" << (have_data ? " − data loading" : "")
       << ": everything else rank 0 did in the step "
          "(forward, backward, optimizer, evaluation on evaluation steps, launching collectives). "
       << (have_inflight
               ? "<b>overlapped communication</b> = Σ<sub>op</sub> max(0, <code>comm_&lt;op&gt;_inflight_s</code> − "
                 "<code>comm_&lt;op&gt;_wait_s</code>), capped at the step's compute: time an asynchronous collective was "
                 "in flight (launch to observed completion) while rank 0 kept computing (over the run: " +
                     seconds_label(total_overlap) +
                     "). Completion is observed when rank 0 next polls MPI, so this is an upper bound. "
               : "<b>Overlapped communication</b> is not drawn: this run's metrics.jsonl has no "
                 "<code>comm_&lt;op&gt;_inflight_s</code> (runs from before it was recorded). ")
       << "Timings are rank 0's.";
  if (clipped > 0) note << " On " << num(clipped, 10) << " step(s) the waits exceeded step_time_s; compute is drawn as 0 there.";
  return section(svg, note.str());
}

std::string chart_comm_bytes(const RunData& run) {
  const std::string id = "chart-comm-bytes", title = "Communication volume per step";
  const auto ops = comm_ops(run);
  std::vector<Series> s;
  double lo = INFINITY, hi = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& c = run.column("comm_" + ops[i] + "_bytes");
    if (!run.has("comm_" + ops[i] + "_bytes")) continue;
    for (double v : c)
      if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
    s.push_back({ops[i], kPalette[(i + 1) % 10], run.steps, c, run.steps.size() <= 60 ? "line+marker" : "line"});
  }
  // plan.json's per-step bytes for the run's stage, when it has them, as dashed levels.
  std::vector<std::string> planned_ops;
  if (run.plan && run.memory) {
    std::string where;
    const double stage = run.memory->value("stage", -1.0);
    if (const json* p = plan_memory(*run.plan, stage, where); p && p->contains("comm_bytes_per_step") &&
                                                               (*p)["comm_bytes_per_step"].is_object()) {
      const auto& cb = (*p)["comm_bytes_per_step"];
      for (auto it = cb.begin(); it != cb.end(); ++it) {
        if (!it.value().is_number() || it.value().get<double>() <= 0) continue;
        const double v = it.value().get<double>();
        lo = std::min(lo, v), hi = std::max(hi, v);
        const auto pos = std::find(ops.begin(), ops.end(), it.key());
        const size_t color = pos == ops.end() ? 9 : (pos - ops.begin() + 1) % 10;
        s.push_back({"plan: " + it.key(), kPalette[color], run.steps, std::vector<double>(run.steps.size(), v), "dash"});
        planned_ops.push_back(it.key());
      }
    }
  }
  AxisSpec y;
  y.title = "bytes contributed by rank 0";
  y.label = bytes_label;
  y.tooltip = [](double v) { return bytes_label(v) + " (" + thousands(v) + " bytes)"; };
  y.log = hi > 0 && hi / lo > 100;
  y.base = 32;  // ticks at 32 B, 1 KiB, 32 KiB, 1 MiB, ...
  y.zero_based = !y.log;
  y.binary = !y.log;
  const std::string svg =
      line_chart(id, title, s, step_axis(), y, "no communication recorded (comm_<op>_bytes absent or zero: one rank?)");

  std::ostringstream note;
  note << "<b>comm_&lt;op&gt;_bytes</b>: bytes rank 0 handed to each collective during the step (its input size: the full "
          "buffer for all_reduce and reduce_scatter, its own shard for all_gather)"
       << (y.log ? "; log scale, gaps are steps without that collective" : "") << ".";
  if (!planned_ops.empty())
    note << " Dashed: <code>comm_bytes_per_step</code> of plan.json's entry for this stage (the planner's message "
            "bytes per rank per step).";
  if (!ops.empty()) {
    note << "</p><table class=\"comm\"><tr><th>collective</th><th>mean bytes / step</th><th>total bytes</th>"
            "<th>mean exposed wait / step</th><th>share of step time</th></tr>";
    const double time = finite_sum(run.column("step_time_s"));
    for (const auto& op : ops) {
      const auto& b = run.column("comm_" + op + "_bytes");
      const auto& w = run.column("comm_" + op + "_wait_s");
      note << "<tr><td>" << esc(op) << "</td><td>" << bytes_label(finite_mean(b)) << "</td><td>"
           << bytes_label(finite_sum(b)) << "</td><td>" << seconds_label(finite_mean(w)) << "</td><td>"
           << num(time > 0 ? 100 * finite_sum(w) / time : kNaN, 3) << "%</td></tr>";
    }
    note << "</table><p class=\"note\">Bytes and waits are rank 0's, summed over the step's calls of each collective.";
  }
  return section(svg, note.str());
}

}  // namespace shardlm::observe
