// `shardlm report RUN_DIR`: one self-contained HTML page (inline SVG, inline CSS and script, no
// network) drawn from what a run directory holds: metrics.jsonl, memory.json, train_config.json and,
// when the planner has written one, plan.json. Every number on the page is read from those files or
// derived from them by the arithmetic stated under its chart; nothing is estimated.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::observe {

// A run directory as the report reads it.
struct RunData {
  std::string dir;
  std::vector<double> steps;                           // metrics.jsonl "step", strictly increasing
  std::map<std::string, std::vector<double>> columns;  // every numeric field by name; NaN where absent or null
  std::optional<nlohmann::json> memory;                // memory.json (bytes per rank, rank 0's file)
  std::optional<nlohmann::json> plan;                  // plan.json (the planner's prediction)
  std::optional<nlohmann::json> config;                // train_config.json (the resolved config)
  // pipeline_timeline.jsonl's last complete record (a pipeline-parallel run's events of one step).
  std::optional<nlohmann::json> pipeline_timeline;
  // restarts.jsonl (the elastic supervisor's record of each restart, cli/elastic.h); empty: none.
  std::vector<nlohmann::json> restarts;
  size_t cut_last_line = 0;  // metrics.jsonl's last line, cut mid-write (disk full, a kill), left out; 0: none

  // The named column, or all-NaN when no record has it.
  std::vector<double> column(const std::string& name) const;
  // True when at least one record holds a finite value for `name`.
  bool has(const std::string& name) const;
};

// Reads run_dir; throws shardlm::Error naming the file and the problem when the directory or
// metrics.jsonl is missing or unreadable, or a file present is not valid JSON.
RunData load_run(const std::string& run_dir);

// One function per chart. Each returns a <section> holding an inline <svg class="chart" id="chart-…">
// and a note saying how its numbers are derived; with no data the SVG says why instead.
std::string chart_loss(const RunData& run);         // training loss per step, validation loss where evaluated
std::string chart_tokens_per_s(const RunData& run); // throughput
std::string chart_lr(const RunData& run);           // learning rate
std::string chart_grad_norm(const RunData& run);    // global gradient norm before clipping; skipped steps marked
std::string chart_loss_scale(const RunData& run);   // fp16 loss scale (global and per unit), skipped steps
std::string chart_memory(const RunData& run);       // bytes per rank by category, measured vs plan.json
std::string chart_step_time(const RunData& run);    // compute vs exposed communication per step
std::string chart_comm_bytes(const RunData& run);   // bytes per step per collective
std::string chart_pipeline_timeline(const RunData& run);  // every stage's forward/backward/send/recv of one step
std::string chart_pipeline_bubble(const RunData& run);    // measured idle fraction per step vs (p-1)/(m+p-1)
std::string chart_experts(const RunData& run);            // mixture of experts: each expert's share of routed tokens

// Sections that are tables and notes (report_sections.cpp): that metrics.jsonl's last record was cut
// off (empty when it was not), and each rank's peak memory with the imbalance across ranks (empty
// for runs that did not record it).
std::string cut_metrics_note(const RunData& run);
std::string memory_per_rank_table(const RunData& run);
std::string restarts_table(const RunData& run);  // each elastic restart: when, why, ranks, resumed step

// The whole page. refresh_s > 0: a live page (report --watch) that the browser reloads every
// refresh_s seconds while the run trains.
std::string render_report(const RunData& run, int refresh_s = 0);

// Reads run_dir and writes the page to out_file (run_dir/report.html when empty), replacing it in
// one rename; returns the path written.
std::string write_report(const std::string& run_dir, const std::string& out_file = "", int refresh_s = 0);

}  // namespace shardlm::observe
