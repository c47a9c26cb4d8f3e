// The report's pipeline and mixture-of-experts charts (report.h): one step's pipeline timeline, the
// measured bubble per step, and each expert's share of routed tokens. Kept apart from the training
// curves (report_charts.cpp) because they read what only pipeline or MoE runs write.
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
using nlohmann::json;
using report_detail::lowest_and_highest;
using report_detail::section;
using report_detail::step_axis;

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
