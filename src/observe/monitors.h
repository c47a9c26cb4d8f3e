// DeepSpeed's monitor sections (deepspeed/monitor/config.py), as far as shardlm writes them:
// `tensorboard` (event files) and `csv_monitor` (CSV files), each under output_path/job_name, with
// DeepSpeed's defaults (output_path "": the working directory; job_name "DeepSpeedJobName", which
// may nest folders with '/'). And the one stream a run's step records go through: metrics.jsonl
// plus the enabled monitors, written by the logging rank (docs/monitoring.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "observe/metrics.h"

namespace shardlm::observe {

struct MonitorConfig {
  bool enabled = false;
  std::string output_path;                   // "": the working directory
  std::string job_name = "DeepSpeedJobName"; // a folder inside output_path; may hold '/', never '..'
};

// The monitor's directory, output_path/job_name. Fails naming `section`.job_name and the fix when
// job_name is absolute or has a '..' component (it would climb out of output_path).
std::string monitor_dir(const MonitorConfig& m, const std::string& section);
// Before any rank starts: each enabled monitor's job_name is valid and its directory writable
// (else one message naming `<section>.output_path` and the fix).
void check_monitor_dirs(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor);

// The TensorBoard and CSV tag of a metrics.jsonl field: Hugging Face Trainer's names where it has
// one (loss -> train/loss, lr -> train/learning_rate, grad_norm -> train/grad_norm, val_loss ->
// eval/loss), train/<field> for every other.
std::string monitor_tag(const std::string& field);

// One step record to every sink. metrics.jsonl is flushed at each step by itself; the others every
// `flush_every` steps (log_interval), after an evaluation, at flush() and when the stream closes.
class MetricsStream {
 public:
  explicit MetricsStream(int64_t flush_every) : flush_every_(flush_every < 1 ? 1 : flush_every) {}
  ~MetricsStream();
  void add(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }
  void write(const StepMetrics& m);
  void flush();

 private:
  int64_t flush_every_;
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

struct Monitors {
  MonitorConfig tensorboard, csv_monitor;
  int64_t flush_every = 1;
};
// out_dir/metrics.jsonl plus the enabled monitors, for a run resumed after `resumed_at_step` (0:
// fresh). A TensorBoard sink starts a new event file whose SessionLog START is at resumed_at_step + 1,
// the first step this run writes: TensorBoard drops what earlier files hold from that step on.
std::unique_ptr<MetricsStream> open_metrics(const std::string& out_dir, int64_t resumed_at_step, const Monitors& monitors);

}  // namespace shardlm::observe
