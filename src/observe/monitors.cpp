// See monitors.h.
#include "observe/monitors.h"

#include <cstdio>
#include <filesystem>

#include "observe/csv_monitor.h"
#include "observe/tensorboard_writer.h"
#include "util/error.h"
#include "util/writable_dir.h"

namespace shardlm::observe {
namespace fs = std::filesystem;

namespace {

// Every scalar of a step record, tagged, into one Event of the run's event file.
class TensorBoardSink : public MetricsSink {
 public:
  TensorBoardSink(const std::string& dir, int64_t first_step) : writer_(dir, first_step) {}
  void write(const StepMetrics& m) override {
    Scalars scalars;
    for (const auto& [field, value] : numeric_fields(m)) scalars.emplace_back(monitor_tag(field), value);
    writer_.add_scalars(m.step, scalars);
  }
  void flush() override { writer_.flush(); }

 private:
  TensorBoardWriter writer_;
};

}  // namespace

std::string monitor_dir(const MonitorConfig& m, const std::string& section) {
  const fs::path job(m.job_name);
  if (job.is_absolute())
    fail(section, ".job_name \"", m.job_name, "\" is an absolute path; it names a folder inside ", section,
         ".output_path: put the parent folder in ", section, ".output_path and the last part in ", section, ".job_name");
  for (const auto& part : job)
    if (part == "..")
      fail(section, ".job_name \"", m.job_name, "\" climbs out of ", section, ".output_path with '..'; name a folder "
           "inside it (a '/' nests folders, e.g. \"exp1/run2\"), or change ", section, ".output_path instead");
  return m.output_path.empty() ? job.string() : (fs::path(m.output_path) / job).string();
}

void check_monitor_dirs(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor) {
  for (const auto& [m, section] : {std::pair{&tensorboard, "tensorboard"}, std::pair{&csv_monitor, "csv_monitor"}}) {
    if (!m->enabled) continue;
    const std::string dir = monitor_dir(*m, section), key = std::string(section) + ".output_path";
    util::require_writable_dir(m->output_path.empty() ? "." : m->output_path, key);
    util::require_writable_dir(dir, key);
  }
}

std::string monitor_tag(const std::string& field) {
  if (field == "loss") return "train/loss";
  if (field == "lr") return "train/learning_rate";
  if (field == "grad_norm") return "train/grad_norm";
  if (field == "val_loss") return "eval/loss";
  return "train/" + field;
}

MetricsStream::~MetricsStream() {
  try {
    flush();
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: %s\n", e.what());
  }
}

void MetricsStream::write(const StepMetrics& m) {
  for (auto& sink : sinks_) sink->write(m);
  if (m.step % flush_every_ == 0 || m.val_loss) flush();
}

void MetricsStream::flush() {
  for (auto& sink : sinks_) sink->flush();
}

std::unique_ptr<MetricsStream> open_metrics(const std::string& out_dir, int64_t resumed_at_step, const Monitors& monitors) {
  auto stream = std::make_unique<MetricsStream>(monitors.flush_every);
  stream->add(std::make_unique<MetricsWriter>((fs::path(out_dir) / "metrics.jsonl").string(), resumed_at_step));
  if (monitors.tensorboard.enabled)
    stream->add(std::make_unique<TensorBoardSink>(monitor_dir(monitors.tensorboard, "tensorboard"), resumed_at_step + 1));
  if (monitors.csv_monitor.enabled)
    stream->add(std::make_unique<CsvMonitor>(monitor_dir(monitors.csv_monitor, "csv_monitor"), resumed_at_step));
  return stream;
}

}  // namespace shardlm::observe
