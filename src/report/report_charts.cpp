// The report's training-curve charts (report.h): loss, throughput, learning rate, gradient norm and
// loss scale, drawn with the SVG kit (svg_chart.h). Memory, time and communication charts are in
// report_charts_resources.cpp; pipeline and expert charts in report_charts_pipeline.cpp.
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

namespace report_detail {

using nlohmann::json;
using namespace svg;  // the chart kit (report/svg_chart.h)

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

// ---- chart pieces (report_chart_pieces.h) -----------------------------------------------------------

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

}  // namespace report_detail

using nlohmann::json;
using namespace svg;  // the chart kit (report/svg_chart.h)
using report_detail::config_text;
using report_detail::lowest_and_highest;
using report_detail::section;
using report_detail::skipped_steps;
using report_detail::step_axis;

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

}  // namespace shardlm::observe
