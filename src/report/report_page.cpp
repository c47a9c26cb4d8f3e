// The report page: the summary table, the charts in a grid, the style, and the script that checks
// in a browser that every chart rendered (report.h: render_report, write_report).
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include "report/diagnosis.h"
#include "report/report_internal.h"
#include "report/svg_chart.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::observe {

using namespace svg;  // the chart kit (report/svg_chart.h)
using nlohmann::json;
namespace fs = std::filesystem;
using report_detail::config_text;
using report_detail::skipped_steps;

namespace {

std::string summary_table(const RunData& run) {
  const auto& mem = run.memory;
  auto mem_text = [&](const char* k) { return mem && mem->contains(k) ? esc((*mem)[k].is_string() ? (*mem)[k].get<std::string>() : (*mem)[k].dump()) : "–"; };
  const auto& tps = run.column("tokens_per_s");
  const auto skipped = skipped_steps(run);
  std::ostringstream o;
  o << "<table class=\"summary\">"
    << "<tr><th>run directory</th><td><code>" << esc(fs::absolute(run.dir).lexically_normal().string()) << "</code></td></tr>"
    << "<tr><th>steps recorded</th><td>" << num(run.steps.front(), 10) << "–" << num(run.steps.back(), 10) << " ("
    << run.steps.size() << " records; config steps " << esc(config_text(run.config, "/steps")) << ")</td></tr>"
    << "<tr><th>final loss / last val_loss</th><td>" << num(last_finite(run.column("loss")), 5) << " / "
    << num(last_finite(run.column("val_loss")), 5) << "</td></tr>"
    << "<tr><th>data-parallel ranks · ZeRO stage · compute dtype</th><td>" << mem_text("dp_size") << " · "
    << (mem ? mem_text("stage") : esc(config_text(run.config, "/zero_optimization/stage"))) << " · " << mem_text("compute_dtype")
    << "</td></tr>"
    << "<tr><th>parameters</th><td>" << (mem && mem->contains("parameters") ? thousands((*mem)["parameters"].get<double>()) : "–")
    << "</td></tr>"
    << "<tr><th>micro-batch × seq_len × accumulation</th><td>"
    << esc(config_text(run.config, "/train_micro_batch_size_per_gpu")) << " × " << esc(config_text(run.config, "/data/seq_len"))
    << " × " << esc(config_text(run.config, "/gradient_accumulation_steps")) << "</td></tr>"
    << "<tr><th>mean tokens/s (after step 1) · total step time</th><td>"
    << thousands(finite_mean(tps, run.steps.size() > 1 ? 1 : 0)) << " · " << seconds_label(finite_sum(run.column("step_time_s")))
    << "</td></tr>"
    << "<tr><th>skipped steps (fp16 overflow)</th><td>"
    << (run.has("skipped") || run.has("loss_scale") ? std::to_string(skipped.size()) : std::string("– (not fp16)"))
    << "</td></tr></table>";
  return o.str();
}

const char* const kStyle = R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #222;
       margin: 16px 20px; background: #fff; }
h1 { font-size: 21px; margin: 0 0 8px; }
table.summary, table.comm { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
table.summary th { text-align: left; font-weight: 600; padding: 2px 14px 2px 0; color: #444; }
table.summary td, table.comm td, table.comm th { padding: 2px 10px 2px 0; }
table.comm th { text-align: left; border-bottom: 1px solid #bbb; font-weight: 600; }
.grid-layout { display: grid; grid-template-columns: repeat(auto-fill, minmax(570px, 1fr)); gap: 14px; }
section.panel { border: 1px solid #ddd; border-radius: 6px; padding: 6px 8px; }
p.note { font-size: 12px; color: #444; margin: 4px 2px; max-width: 560px; }
svg.chart { display: block; font-size: 11px; }
svg.chart text { fill: #333; }
svg.chart .title { font-size: 14px; font-weight: 600; }
svg.chart .plot-area { fill: #fcfcfc; stroke: #999; }
svg.chart .grid { stroke: #e3e3e3; }
svg.chart .tick { stroke: #999; }
svg.chart .axis-title { font-size: 11px; fill: #555; }
svg.chart .no-data, svg.chart .plot-note { font-size: 12px; fill: #a33; font-style: italic; }
svg.chart .caption { font-size: 10px; fill: #777; }
svg.chart .bar-label { font-size: 11px; }
code { font-size: 12px; background: #f3f3f3; padding: 0 2px; }
)CSS";

// Runs after the charts: every chart must exist, lay out to a non-empty box and hold data (or say why
// not); the title becomes "report-ok" only then, so a headless browser can check the page rendered.
const char* const kCheckScript = R"JS(
(function () {
  var problems = window.__reportErrors.slice();
  var ids = JSON.parse(document.getElementById('chart-ids').textContent);
  ids.forEach(function (id) {
    var svg = document.getElementById(id);
    if (!svg) { problems.push(id + ': missing'); return; }
    var box = svg.getBoundingClientRect();
    if (!(box.width > 0 && box.height > 0)) problems.push(id + ': empty box');
    var data = svg.querySelectorAll('.series[data-points]');
    var points = 0;
    for (var i = 0; i < data.length; ++i) points += parseInt(data[i].getAttribute('data-points'), 10) || 0;
    if (points === 0 && !svg.querySelector('.no-data')) problems.push(id + ': no data and no reason');
    svg.setAttribute('data-rendered', points > 0 ? 'data' : 'no-data');
  });
  document.body.setAttribute('data-report-status', problems.length ? 'error' : 'ok');
  document.title = problems.length ? 'report-error: ' + problems.join('; ') : 'report-ok';
})();
)JS";

}  // namespace

std::string render_report(const RunData& run, int refresh_s) {
  std::vector<std::pair<std::string, std::string>> charts = {
      {"chart-loss", chart_loss(run)},
      {"chart-tokens-per-s", chart_tokens_per_s(run)},
      {"chart-lr", chart_lr(run)},
      {"chart-grad-norm", chart_grad_norm(run)},
      {"chart-loss-scale", chart_loss_scale(run)},
      {"chart-memory", chart_memory(run)},
      {"chart-step-time", chart_step_time(run)},
      {"chart-comm-bytes", chart_comm_bytes(run)},
  };
  if (run.has("pipeline_bubble") || run.pipeline_timeline) {
    charts.push_back({"chart-pipeline-timeline", chart_pipeline_timeline(run)});
    charts.push_back({"chart-pipeline-bubble", chart_pipeline_bubble(run)});
  }
  if (run.has("moe_tokens_expert_0")) charts.push_back({"chart-experts", chart_experts(run)});
  json ids = json::array();
  for (const auto& c : charts) ids.push_back(c.first);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
       "script-src 'unsafe-inline'\">"
    << (refresh_s > 0 ? "<meta http-equiv=\"refresh\" content=\"" + std::to_string(refresh_s) + "\">" : std::string())
    << "<title>shardlm report</title><style>" << kStyle << "</style>"
    << "<script>window.__reportErrors = [];"
       "window.addEventListener('error', function (e) { window.__reportErrors.push('error: ' + e.message); });"
       "(function () { var orig = console.error; console.error = function () {"
       " window.__reportErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));"
       " return orig.apply(console, arguments); }; })();</script></head>\n<body>\n"
    << "<h1>shardlm run report</h1>"
    << (refresh_s > 0 ? "<p class=\"note\" id=\"live\">Live: <code>shardlm report --watch</code> rewrites this page every " +
                            std::to_string(refresh_s) + " s while the run trains, and the page reloads itself.</p>"
                      : std::string())
    << summary_table(run) << cut_metrics_note(run) << restarts_table(run) << memory_per_rank_table(run)
    << diagnosis_section(run)
    << "\n<div class=\"grid-layout\">\n";
  for (const auto& c : charts) o << c.second;
  o << "</div>\n<p class=\"note\">Generated by <code>shardlm report</code> from metrics.jsonl"
    << (run.memory ? ", memory.json" : "") << (run.config ? ", train_config.json" : "") << (run.plan ? ", plan.json" : "")
    << ". Self-contained: no scripts, styles or fonts are loaded from elsewhere.</p>\n"
    << "<script type=\"application/json\" id=\"chart-ids\">" << ids.dump() << "</script>\n<script>" << kCheckScript
    << "</script>\n</body></html>\n";
  return o.str();
}

std::string write_report(const std::string& run_dir, const std::string& out_file, int refresh_s) {
  const RunData run = load_run(run_dir);
  const std::string path = out_file.empty() ? (fs::path(run_dir) / "report.html").string() : out_file;
  const std::string html = render_report(run, refresh_s);
  const auto parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent)) fail("cannot write ", path, ": directory ", parent.string(), " does not exist");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << html;
    out.close();
    if (!out) fail("cannot write ", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot move ", tmp, " to ", path, ": ", ec.message());
  return path;
}

}  // namespace shardlm::observe
