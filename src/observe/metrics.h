// What a run reports: one JSON object per step in out_dir/metrics.jsonl (the machine-readable
// record the report and tests read) and a human progress line on rank 0. The step's record is one
// stream with sinks (monitors.h): metrics.jsonl here, TensorBoard event files and CSV files beside.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::observe {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps taken
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double step_time_s = 0;
  std::optional<double> val_loss;
  std::map<std::string, double> extra;  // e.g. comm bytes and wait time per operation
};

// Every numeric field of the step's metrics.jsonl record but `step`, by its name there (NaN where
// the record holds null): what the TensorBoard and CSV sinks write as scalars.
std::vector<std::pair<std::string, double>> numeric_fields(const StepMetrics& m);

// Where a step's record goes (metrics.jsonl, TensorBoard, CSV). write() is called once per step in
// step order; flush() makes what was written readable by others (MetricsStream decides when).
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const StepMetrics& m) = 0;
  virtual void flush() {}
};

// What a resumed run keeps of a per-step log it appends to: the lines of `path` whose step
// (step_of; nullopt: not a whole record, e.g. cut by a kill) is at most resumed_at_step, each with
// its newline. A fresh run (resumed_at_step = 0) keeps nothing. metrics.jsonl and the CSV files
// share it, so both drop the steps written after the checkpoint the run resumed from.
std::string lines_through_step(const std::string& path, int64_t resumed_at_step,
                               const std::function<std::optional<int64_t>(const std::string&)>& step_of);

// metrics.jsonl. Flushed at every step: a crash keeps every completed step on disk.
class MetricsWriter : public MetricsSink {
 public:
  // A fresh run (resumed_at_step = 0) truncates `path`; a run resumed after step s keeps the
  // records of steps 1..s and drops later ones (written after the checkpoint, before a crash).
  MetricsWriter(const std::string& path, int64_t resumed_at_step);
  void write(const StepMetrics& m) override;

 private:
  std::ofstream out_;
  std::string path_;
};

// "step 12/300 | loss 5.4321 | lr 3.00e-04 | grad_norm 1.234 | 5,432 tok/s | 62 s elapsed | eta 4m10s" (util::format_duration)
// elapsed_s covers steps_this_run steps (fewer than m.step after a resume); the ETA extrapolates them.
std::string progress_line(const StepMetrics& m, int64_t total_steps, double elapsed_s, int64_t steps_this_run);
std::string format_duration(double seconds);
std::string format_number(double value);  // shortest of %g

}  // namespace shardlm::observe
