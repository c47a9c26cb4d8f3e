#include "observe/metrics.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/units.h"

namespace shardlm::observe {

std::string lines_through_step(const std::string& path, int64_t resumed_at_step,
                               const std::function<std::optional<int64_t>(const std::string&)>& step_of) {
  std::string kept;
  if (resumed_at_step <= 0) return kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto step = step_of(line);
    if (step && *step <= resumed_at_step) kept += line + "\n";
  }
  return kept;
}

std::vector<std::pair<std::string, double>> numeric_fields(const StepMetrics& m) {
  std::vector<std::pair<std::string, double>> out = {{"loss", m.loss},
                                                     {"lr", m.lr},
                                                     {"grad_norm", m.grad_norm},
                                                     {"tokens_per_s", m.tokens_per_s},
                                                     {"step_time_s", m.step_time_s}};
  if (m.val_loss) out.emplace_back("val_loss", *m.val_loss);
  for (const auto& [k, v] : m.extra) out.emplace_back(k, v);
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at_step) : path_(path) {
  const std::string kept = lines_through_step(path, resumed_at_step, [](const std::string& line) -> std::optional<int64_t> {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    return j.value("step", int64_t{0});
  });
  out_.open(path, std::ios::trunc);
  out_ << kept;
  if (!out_) fail("cannot write metrics file '", path, "'");
}

void MetricsWriter::write(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step}};
  for (const auto& [k, v] : numeric_fields(m)) j[k] = v;  // NaN is written as null
  out_ << j.dump() << "\n";
  out_.flush();  // a crash keeps every completed step on disk
  if (!out_) fail("writing metrics to '", path_, "' failed (disk full?)");
}

std::string format_duration(double s) { return s < 0 ? "?" : util::format_duration(s); }

std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

std::string progress_line(const StepMetrics& m, int64_t total_steps, double elapsed_s, int64_t steps_this_run) {
  const double remaining = steps_this_run > 0 ? elapsed_s / steps_this_run * (total_steps - m.step) : NAN;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | grad_norm %.3f | %.0f tok/s | %s elapsed | eta %s",
                static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss, m.lr, m.grad_norm,
                m.tokens_per_s, format_duration(elapsed_s).c_str(), format_duration(remaining).c_str());
  std::string line = buf;
  if (m.val_loss) {
    std::snprintf(buf, sizeof buf, " | val_loss %.4f", *m.val_loss);
    line += buf;
  }
  return line;
}

}  // namespace shardlm::observe
