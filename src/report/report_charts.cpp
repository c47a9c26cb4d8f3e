// The report's charts, one function per chart (report.h), drawn with the SVG kit (svg_chart.h).
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "report/report_internal.h"
#include "report/svg_chart.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::observe {

namespace report_detail {

using nlohmann::json;

// Steps the loss scaler skipped: `skipped` = 1, or (without that column) a null grad_norm.
std::vector<double> skipped_steps(const RunData& run) {
  std::vector<double> out;
  const auto& skipped = run.column("skipped");
  const auto& gn = run.column("grad_norm");
  const bool have = run.has("skipped");
  for (size_t i = 0; i < run.steps.size(); ++i)
    if (have ? (std::isfinite(skipped[i]) && skipped[i] > 0) : !std::isfinite(gn[i])) out.push_back(run.steps[i]);
  return out;
}

std::string config_text(const std::optional<json>& cfg, const std::string& pointer) {
  if (!cfg) return "–";
  const json::json_pointer ptr(pointer);
  if (!cfg->contains(ptr)) return "–";
  const auto& v = cfg->at(ptr);
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace report_detail

using namespace svg;  // the chart kit (report/svg_chart.h)

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// ---- chart pieces ---------------------------------------------------------------------------------

// The lowest and highest finite value at each step over several series of n steps (NaN where none
// is finite): a band drawn where one line per series would be too many.
std::pair<std::vector<double>, std::vector<double>> lowest_and_highest(const std::vector<std::vector<double>>& series,
                                                                       size_t n) {
  std::vector<double> lo(n, kNaN), hi(n, kNaN);
  for (const auto& c : series)
    for (size_t i = 0; i < n && i < c.size(); ++i)
      if (std::isfinite(c[i])) {
        lo[i] = std::isfinite(lo[i]) ? std::min(lo[i], c[i]) : c[i];
        hi[i] = std::isfinite(hi[i]) ? std::max(hi[i], c[i]) : c[i];
      }
  return {lo, hi};
}

std::string section(const std::string& svg, const std::string& note_html) {
  return "<section class=\"panel\">" + svg + "<p class=\"note\">" + note_html + "</p></section>\n";
}

AxisSpec step_axis() {
  AxisSpec a;
  a.title = "optimizer step";
  a.integer = true;
  a.label = [](double v) { return num(v, 10); };
  return a;
}

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
using report_detail::skipped_steps;

// ---- charts --------------------------------------------------------------------------------------

std::string chart_loss(const RunData& run) {
  std::vector<Series> s;
  s.push_back({"training loss", kPalette[0], run.steps, run.column("loss"), "line"});
  const bool val = run.has("val_loss");
  if (val) {
    std::vector<double> vx, vy;
    const auto v = run.column("val_loss");
    for (size_t i = 0; i < v.size(); ++i)
      if (std::isfinite(v[i])) vx.push_back(run.steps[i]), vy.push_back(v[i]);
    s.push_back({"validation loss", kPalette[1], vx, vy, "line+marker"});
  }
  AxisSpec y;
  y.title = "cross-entropy (nats/token)";
  const std::string svg = line_chart("chart-loss", "Loss", s, step_axis(), y, "no finite loss in metrics.jsonl");
  return section(svg, std::string("<b>loss</b>: mean cross-entropy over every token of the step's global batch, before "
                                  "the update. <b>val_loss</b>: mean over the validation batches of all ranks, on the "
                                  "steps where the run evaluated") +
                          (val ? "." : " (this run has no evaluations: no val_loss in metrics.jsonl)."));
}

std::string chart_tokens_per_s(const RunData& run) {
  const auto& tps = run.column("tokens_per_s");
  const double mean = finite_mean(tps, run.steps.size() > 1 ? 1 : 0);
  std::vector<Series> s{{"tokens/s", kPalette[2], run.steps, tps, "line"}};
  AxisSpec y;
  y.title = "tokens / s (all ranks)";
  y.zero_based = true;
  y.label = [](double v) { return thousands(v); };
  const std::string svg = line_chart("chart-tokens-per-s", "Throughput", s, step_axis(), y, "no tokens_per_s in metrics.jsonl");
  return section(svg, "<b>tokens_per_s</b> = tokens in the step's global batch (micro-batch × seq_len × accumulation × "
                      "data-parallel ranks) / step_time_s. Mean" +
                          std::string(run.steps.size() > 1 ? " over the steps after the first (which includes warm-up)" : "") +
                          ": " + thousands(mean) + " tokens/s.");
}

std::string chart_lr(const RunData& run) {
  std::vector<Series> s{{"learning rate", kPalette[4], run.steps, run.column("lr"), "line"}};
  AxisSpec y;
  y.title = "learning rate";
  y.zero_based = true;
  const std::string svg = line_chart("chart-lr", "Learning rate", s, step_axis(), y, "no lr in metrics.jsonl");
  return section(svg, "<b>lr</b>: the rate the optimizer applied at this step (scheduler <code>" +
                          esc(config_text(run.config, "/scheduler/type")) + "</code>).");
}

std::string chart_grad_norm(const RunData& run) {
  std::vector<Series> s{{"gradient norm", kPalette[3], run.steps, run.column("grad_norm"), "line"}};
  const auto skipped = skipped_steps(run);
  if (!skipped.empty()) s.push_back({"skipped step (no norm)", kSkipColor, skipped, skipped, "skip"});
  AxisSpec y;
  y.title = "global L2 norm";
  y.zero_based = true;
  const json::json_pointer clip_key("/gradient_clipping");
  const double clip = run.config && run.config->contains(clip_key) && run.config->at(clip_key).is_number()
                          ? run.config->at(clip_key).get<double>()
                          : 0.0;
  if (clip > 0 && run.has("grad_norm"))
    s.push_back({"clipping threshold " + num(clip), "#555", run.steps, std::vector<double>(run.steps.size(), clip), "dash"});
  const std::string svg = line_chart("chart-grad-norm", "Gradient norm", s, step_axis(), y, "no grad_norm in metrics.jsonl");
  return section(svg, "<b>grad_norm</b>: global L2 norm of the gradients before clipping (dashed: "
                      "<code>gradient_clipping</code>). fp16 steps skipped for overflow record no norm (null in "
                      "metrics.jsonl) and are marked ▲ on the axis.");
}

std::string chart_loss_scale(const RunData& run) {
  const auto skipped = skipped_steps(run);
  const double total_skipped = run.has("skipped_steps") ? last_finite(run.column("skipped_steps")) : skipped.size();
  std::vector<Series> s;
  if (run.has("loss_scale")) s.push_back({"loss scale", kPalette[0], run.steps, run.column("loss_scale"), "line"});
  std::vector<std::string> units;
  for (const auto& [k, v] : run.columns)
    if (k.rfind("loss_scale.", 0) == 0) units.push_back(k);
  std::string unit_note;
  if (!units.empty() && units.size() <= 8) {
    for (size_t u = 0; u < units.size(); ++u)
      s.push_back({units[u].substr(11), kPalette[(u + 1) % 10], run.steps, run.column(units[u]), "dash"});
    unit_note = " Dashed: each unit's own scale (<code>loss_scale.&lt;unit&gt;</code>, per-unit loss scaling).";
  } else if (!units.empty()) {
    std::vector<std::vector<double>> scales;
    for (const auto& u : units) scales.push_back(run.column(u));
    const auto [lo, hi] = lowest_and_highest(scales, run.steps.size());
    s.push_back({"lowest unit scale", kPalette[1], run.steps, lo, "dash"});
    s.push_back({"highest unit scale", kPalette[2], run.steps, hi, "dash"});
    unit_note = " Dashed: the lowest and highest of the " + std::to_string(units.size()) +
                " per-unit scales (<code>loss_scale.&lt;unit&gt;</code>) at each step.";
  }
  if (s.empty())
    return section(empty_chart("chart-loss-scale", "Loss scale and skipped steps",
                               "no loss scale: fp16 is not enabled in this run"),
                   "fp16 dynamic loss scaling writes <code>loss_scale</code>, <code>skipped</code> and "
                   "<code>skipped_steps</code> to metrics.jsonl; this run has none of them.");
  s.push_back({"skipped step (" + num(total_skipped, 10) + " in all)", kSkipColor, skipped, skipped, "skip"});
  AxisSpec y;
  y.title = "loss scale (log₂)";
  y.log = true;
  y.base = 2;
  y.label = [](double v) { return "2^" + num(std::log2(v), 4); };
  const std::string svg = line_chart("chart-loss-scale", "Loss scale and skipped steps", s, step_axis(), y,
                                     "no finite positive loss scale in metrics.jsonl");
  return section(svg, "<b>loss_scale</b>: the scale in effect after the step's update (the scaler halves it after an "
                      "overflow and doubles it after <code>loss_scale_window</code> clean steps). ▲ marks steps with "
                      "<code>skipped</code> = 1: gradients overflowed on some rank, so every rank skipped the update; "
                      "the count is the last <code>skipped_steps</code>." + unit_note);
}

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

// ---- pipeline ------------------------------------------------------------------------------------

std::string chart_pipeline_timeline(const RunData& run) {
  const std::string id = "chart-pipeline-timeline", title = "Pipeline timeline (one step)";
  if (!run.pipeline_timeline || !run.pipeline_timeline->contains("stages"))
    return section(empty_chart(id, title, "no pipeline_timeline.jsonl (not a pipeline-parallel run)"),
                   "Written by runs with <code>parallelism.pipeline_parallel</code> &gt; 1.");
  const json& tl = *run.pipeline_timeline;
  const json& stages = tl["stages"];
  double span = 0;
  size_t events = 0;
  for (const auto& st : stages)
    for (const auto& e : st["events"]) span = std::max(span, e[3].get<double>()), ++events;
  if (events == 0 || span <= 0) return section(empty_chart(id, title, "the timeline holds no events"), "");
  // One row per stage: the compute lane (forward, backward) over a thin lane for receives and sends.
  double legend_bottom = 0;
  const std::string legend = legend_svg({{"forward", kPalette[0], "box"}, {"backward", kPalette[2], "box"},
                                         {"weight backward", kPalette[3], "box"}, {"waiting to receive", kPalette[1], "box"}, {"send in flight", kPalette[4], "box"}},
                                        legend_bottom);
  const int row = 40, lane = 20, comm_lane = 9, top = static_cast<int>(legend_bottom) + 12;
  const int height = top + row * static_cast<int>(stages.size()) + kMarginBottom;
  const double left = kMarginLeft, right = kWidth - kMarginRight;
  AxisSpec xa;
  xa.title = "milliseconds from the step's first event";
  xa.zero_based = true;
  const Ticks xt = make_ticks(0, span * 1e3, xa);
  auto x = [&](double seconds) { return left + (seconds * 1e3 - xt.lo) / (xt.hi - xt.lo) * (right - left); };
  struct Kind {
    const char* name;
    const char* color;
    bool compute;
  };
  const std::map<std::string, Kind> kinds = {
      {"forward", {"forward", kPalette[0], true}},          {"backward", {"backward", kPalette[2], true}},
      {"backward_weight", {"weight backward (zb_h1's W)", kPalette[3], true}},
      {"recv_activation", {"waiting to receive", kPalette[1], false}},
      {"recv_gradient", {"waiting to receive", kPalette[1], false}},
      {"send_activation", {"send in flight", kPalette[4], false}}, {"send_gradient", {"send in flight", kPalette[4], false}}};
  std::ostringstream o;
  o << svg_open(id, title, height) << legend;
  const double bottom = top + row * static_cast<double>(stages.size());
  o << "<rect class=\"plot-area\" x=\"" << px(left) << "\" y=\"" << top - 4 << "\" width=\"" << px(right - left)
    << "\" height=\"" << px(bottom - top + 4) << "\"/>";
  for (double t : xt.at) {
    const double xx = left + (t - xt.lo) / (xt.hi - xt.lo) * (right - left);
    o << "<line class=\"grid\" x1=\"" << px(xx) << "\" x2=\"" << px(xx) << "\" y1=\"" << top - 4 << "\" y2=\"" << px(bottom)
      << "\"/><text x=\"" << px(xx) << "\" y=\"" << px(bottom + 16) << "\" text-anchor=\"middle\">" << esc(num(t))
      << "</text>";
  }
  o << "<text class=\"axis-title\" x=\"" << px((left + right) / 2) << "\" y=\"" << px(bottom + 34)
    << "\" text-anchor=\"middle\">" << esc(xa.title) << "</text>";
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& st = stages[s];
    const double y0 = top + row * static_cast<double>(s);
    o << "<text x=\"" << px(left - 6) << "\" y=\"" << px(y0 + 14) << "\" text-anchor=\"end\">stage " << st["stage"].get<int>()
      << "</text><text class=\"caption\" x=\"" << px(left - 6) << "\" y=\"" << px(y0 + 27)
      << "\" text-anchor=\"end\">idle " << num(100 * st.value("bubble", 0.0), 3) << "%</text>";
    o << "<g class=\"series\" data-points=\"" << st["events"].size() << "\">";
    for (const auto& e : st["events"]) {
      const auto it = kinds.find(e[0].get<std::string>());
      if (it == kinds.end()) continue;
      const double x0 = x(e[2].get<double>()), x1 = std::max(x(e[3].get<double>()), x0 + 0.8);
      const double y = it->second.compute ? y0 : y0 + lane + 2, h = it->second.compute ? lane : comm_lane;
      o << "<rect x=\"" << px(x0) << "\" y=\"" << px(y) << "\" width=\"" << px(x1 - x0) << "\" height=\"" << h
        << "\" fill=\"" << it->second.color << "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>" << esc(e[0].get<std::string>())
        << " of micro-batch " << e[1].get<int64_t>() << ": " << num(e[2].get<double>() * 1e3, 5) << "–"
        << num(e[3].get<double>() * 1e3, 5) << " ms</title></rect>";
      if (it->second.compute && x1 - x0 >= 12)
        o << "<text class=\"bar-label\" x=\"" << px((x0 + x1) / 2) << "\" y=\"" << px(y0 + 14)
          << "\" text-anchor=\"middle\" fill=\"#fff\">" << e[1].get<int64_t>() << "</text>";
    }
    o << "</g>";
  }
  o << "</svg>";
  const double p = static_cast<double>(stages.size()), m = tl.value("micro_batches", 0.0);
  std::ostringstream note;
  note << "Step " << tl.value("step", 0) << " of the last record in <code>pipeline_timeline.jsonl</code> (the run writes "
       << "its first three steps and its last). Each stage's row: the compute lane (forward and backward of each "
       << "micro-batch, numbered) over the communication lane: <b>waiting to receive</b> is the time blocked on the "
       << "neighbour's activations or gradient; a <b>send</b> lasts from posting until its completion was observed "
       << "(an upper bound: completion is checked at the next send and at the end of the step). Idle = 1 − compute / "
       << "span of the stage; the schedule's formula ((p−1)/(m+p−1); interleaved (p−1)/(v·m+p−1)) gives "
       << num(tl.value("bubble_formula", m > 0 ? (p - 1) / (m + p - 1) : kNaN), 3) << " for p = " << num(p)
       << ", m = " << num(m) << ", schedule " << tl.value("schedule", std::string("1f1b")) << ".";
  return section(o.str(), note.str());
}

std::string chart_pipeline_bubble(const RunData& run) {
  std::vector<Series> s;
  if (run.has("pipeline_bubble")) s.push_back({"measured (mean over stages)", kPalette[0], run.steps, run.column("pipeline_bubble"), "line"});
  for (int st = 0; run.has("pipeline_bubble.stage" + std::to_string(st)); ++st)
    s.push_back({"stage " + std::to_string(st), kPalette[(st + 2) % 10], run.steps,
                 run.column("pipeline_bubble.stage" + std::to_string(st)), "line"});
  if (run.has("pipeline_bubble_formula"))
    s.push_back({"(p−1)/(m+p−1)", kPalette[3], run.steps, run.column("pipeline_bubble_formula"), "dash"});
  AxisSpec y;
  y.title = "idle fraction of the step";
  y.zero_based = true;
  const std::string svg =
      line_chart("chart-pipeline-bubble", "Pipeline bubble", s, step_axis(), y, "no pipeline_bubble in metrics.jsonl");
  std::ostringstream note;
  note << "<b>pipeline_bubble.stage&lt;s&gt;</b> = 1 − (time computing forwards and backwards) / (first forward to "
          "last backward) of stage s, measured each step; dashed: the schedule's formula.";
  for (int st = 0; run.has("pipeline_activation_peak.stage" + std::to_string(st)); ++st)
    note << (st == 0 ? " Peak activations held after a forward:" : ",") << " stage " << st << " "
         << bytes_label(finite_max(run.column("pipeline_activation_peak.stage" + std::to_string(st)))) << " ("
         << num(finite_max(run.column("pipeline_alive_micro_batches.stage" + std::to_string(st)))) << " micro-batches alive)";
  return section(svg, note.str() + ".");
}

}  // namespace shardlm::observe

namespace shardlm::observe {

std::string chart_experts(const RunData& run) {
  // Each expert's share of the step's routed assignments (moe_tokens_expert_<e>: all sparse layers,
  // micro-batches and data-parallel ranks); a balanced router gives every expert 1/E.
  std::vector<std::vector<double>> counts;
  for (int e = 0; run.has("moe_tokens_expert_" + std::to_string(e)); ++e)
    counts.push_back(run.column("moe_tokens_expert_" + std::to_string(e)));
  const size_t E = counts.size(), n = run.steps.size();
  std::vector<double> total(n, 0.0), imbalance(n, kNaN);
  for (size_t i = 0; i < n; ++i) {
    double most = 0;
    for (const auto& c : counts) total[i] += std::isfinite(c[i]) ? c[i] : 0, most = std::max(most, std::isfinite(c[i]) ? c[i] : 0);
    if (total[i] > 0) imbalance[i] = most * static_cast<double>(E) / total[i];
  }
  auto share = [&](const std::vector<double>& c) {
    std::vector<double> out(n, kNaN);
    for (size_t i = 0; i < n; ++i)
      if (total[i] > 0 && std::isfinite(c[i])) out[i] = c[i] / total[i];
    return out;
  };
  std::vector<Series> s;
  if (E <= 16) {
    for (size_t e = 0; e < E; ++e) s.push_back({"expert " + std::to_string(e), kPalette[e % 10], run.steps, share(counts[e]), "line"});
  } else {
    std::vector<std::vector<double>> shares;
    for (const auto& c : counts) shares.push_back(share(c));
    const auto [lo, hi] = lowest_and_highest(shares, n);
    s.push_back({"least-used expert", kPalette[1], run.steps, lo, "line"});
    s.push_back({"most-used expert", kPalette[0], run.steps, hi, "line"});
  }
  if (E > 0) s.push_back({"balanced (1/" + std::to_string(E) + ")", "#555", run.steps, std::vector<double>(n, 1.0 / E), "dash"});
  AxisSpec y;
  y.title = "share of routed tokens";
  y.zero_based = true;
  const std::string svg = line_chart("chart-experts", "Tokens per expert", s, step_axis(), y,
                                     "no moe_tokens_expert_<e> in metrics.jsonl");
  std::ostringstream note;
  note << "<b>moe_tokens_expert_&lt;e&gt;</b>: the step's routed assignments to expert e over every sparse layer, "
          "micro-batch and data-parallel rank (top-k counts each token k times), drawn as its share of the step's "
          "total" << (E > 16 ? " (with " + std::to_string(E) + " experts, the least and most used at each step)" : "")
       << ". Load imbalance (most-used expert × E / total, 1 when balanced): "
       << num(last_finite(imbalance), 3) << " at the last step, " << num(finite_mean(imbalance), 3) << " on average.";
  if (run.has("moe_dropped_tokens")) {
    const auto dropped = run.column("moe_dropped_tokens");
    note << " <b>moe_dropped_tokens</b> (over the capacity factor's limit): "
         << thousands(std::accumulate(dropped.begin(), dropped.end(), 0.0,
                                      [](double a, double b) { return a + (std::isfinite(b) ? b : 0); }))
         << " in all.";
  }
  if (run.has("router_aux_loss"))
    note << " <b>router_aux_loss</b> (transformers' load-balancing loss, 1 when balanced, before "
            "router_aux_loss_coef): " << num(last_finite(run.column("router_aux_loss")), 4) << " at the last step.";
  return section(svg, note.str());
}

}  // namespace shardlm::observe
