// See csv_monitor.h.
#include "observe/csv_monitor.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "observe/monitors.h"
#include "util/error.h"

namespace shardlm::observe {
namespace fs = std::filesystem;

std::string csv_file_name(const std::string& tag) {
  std::string name = tag;
  for (auto& ch : name)
    if (ch == '/' || ch == ' ') ch = '_';
  return name + ".csv";
}

std::string csv_header(const std::string& tag) {
  const auto slash = tag.rfind('/');
  return "step," + (slash == std::string::npos ? tag : tag.substr(slash + 1));
}

std::string csv_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return nlohmann::json(v).dump();  // shortest round trip, as Python's repr: 0.1, 3.0, 1e-05
}

namespace {

// The rows of a monitor file a run resumed after `resumed_at_step` keeps, header first. The header
// counts as step 0 (kept); a row whose step does not parse is no whole record.
std::string kept_rows(const std::string& path, int64_t resumed_at_step) {
  return lines_through_step(path, resumed_at_step, [](const std::string& line) -> std::optional<int64_t> {
    if (line.rfind("step,", 0) == 0) return 0;
    char* end = nullptr;
    const long long step = std::strtoll(line.c_str(), &end, 10);
    if (end == line.c_str() || *end != ',' || end[1] == '\0') return std::nullopt;
    return step;
  });
}

}  // namespace

CsvMonitor::CsvMonitor(const std::string& dir, int64_t resumed_at_step) : dir_(dir), resumed_at_step_(resumed_at_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the csv_monitor directory '", dir, "': ", ec.message());
  // Every monitor file already here, also of a tag this run may never write (checkpoint_stall_s after
  // a checkpoint): rows past the resumed step are dropped now; a fresh run keeps the headers only.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".csv") continue;
    std::string header;
    std::getline(std::ifstream(entry.path()), header);
    if (header.rfind("step,", 0) != 0) continue;  // not a monitor file
    const std::string kept = resumed_at_step > 0 ? kept_rows(entry.path().string(), resumed_at_step) : header + "\n";
    std::ofstream(entry.path(), std::ios::trunc) << kept;
  }
}

CsvMonitor::File& CsvMonitor::open(const std::string& tag) {
  auto it = files_.find(tag);
  if (it != files_.end()) return it->second;
  const std::string path = (fs::path(dir_) / csv_file_name(tag)).string();
  std::string kept = kept_rows(path, resumed_at_step_);
  if (kept.empty()) kept = csv_header(tag) + "\n";
  File& f = files_[tag];
  f.out.open(path, std::ios::trunc);
  f.out << kept;
  f.out.flush();
  if (!f.out) fail("cannot write the csv_monitor file '", path, "'");
  return f;
}

void CsvMonitor::write(const StepMetrics& m) {
  for (const auto& [field, value] : numeric_fields(m))
    open(monitor_tag(field)).pending += std::to_string(m.step) + "," + csv_value(value) + "\n";
}

void CsvMonitor::flush() {
  for (auto& [tag, f] : files_) {
    if (f.pending.empty()) continue;
    f.out.write(f.pending.data(), static_cast<std::streamsize>(f.pending.size()));
    f.out.flush();
    if (!f.out) fail("writing the csv_monitor file of ", tag, " in '", dir_, "' failed (disk full?)");
    f.pending.clear();
  }
}

}  // namespace shardlm::observe
