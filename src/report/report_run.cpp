// The run loader of `shardlm report`: metrics.jsonl (a cut last record tolerated and noted), and
// memory.json, plan.json, train_config.json and the last pipeline timeline when present.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "report/report.h"
#include "report/svg_chart.h"
#include "util/error.h"

namespace shardlm::observe {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using svg::kNaN;
using svg::num;

std::optional<json> read_json_file(const std::string& path) {
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  if (!in) fail("cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(path, " is not valid JSON; rerun the command that wrote it or remove the file");
  if (!j.is_object()) fail(path, " must hold a JSON object, found ", j.type_name());
  return j;
}

// The last line of a JSON-lines file that parses as an object (a cut last line is skipped); none
// when the file is absent or holds no such line.
// Every JSON object line of `path` (none when it is absent; lines that are not, e.g. cut by a kill,
// are left out).
std::vector<json> json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) rows.push_back(std::move(j));
  }
  return rows;
}

std::optional<json> last_json_line(const std::string& path) {
  auto rows = json_lines(path);
  if (rows.empty()) return std::nullopt;
  return std::move(rows.back());
}

}  // namespace

// ---- RunData -------------------------------------------------------------------------------------

std::vector<double> RunData::column(const std::string& name) const {
  auto it = columns.find(name);
  return it != columns.end() ? it->second : std::vector<double>(steps.size(), kNaN);
}

bool RunData::has(const std::string& name) const {
  auto it = columns.find(name);
  if (it == columns.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [](double v) { return std::isfinite(v); });
}

namespace {
// A record the writer did not finish (disk full, a kill mid-write): the file's last line, without
// its newline (getline hit the end of the file), that opens like a record.
bool is_cut_last_line(const std::string& line) {
  const auto start = line.find_first_not_of(" \t\r");
  return start != std::string::npos && line[start] == '{';
}
}  // namespace

RunData load_run(const std::string& run_dir) {
  if (!fs::exists(run_dir)) fail("run directory ", run_dir, " does not exist; pass the out_dir of a training run");
  if (!fs::is_directory(run_dir)) fail(run_dir, " is not a directory; pass the out_dir of a training run");
  RunData run;
  run.dir = run_dir;
  const std::string path = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::exists(path))
    fail(path, " does not exist: ", run_dir, " is not a training run directory (train writes metrics.jsonl at its first step)");
  std::ifstream in(path);
  if (!in) fail("cannot read ", path);

  std::vector<json> rows;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && in.eof() && is_cut_last_line(line)) {  // no newline: the write was cut off
      run.cut_last_line = lineno;
      break;
    }
    if (j.is_discarded()) fail(path, " line ", lineno, " is not valid JSON: ", line.substr(0, 80));
    if (!j.is_object()) fail(path, " line ", lineno, " must be a JSON object, found ", j.type_name());
    if (!j.contains("step") || !j["step"].is_number())
      fail(path, " line ", lineno, " has no numeric \"step\" field");
    const double step = j["step"].get<double>();
    if (!run.steps.empty() && step <= run.steps.back())
      fail(path, " line ", lineno, ": step ", num(step, 10), " follows step ", num(run.steps.back(), 10),
           "; steps must increase (was the file edited or written by two runs?)");
    run.steps.push_back(step);
    rows.push_back(std::move(j));
  }
  if (in.bad()) fail("reading ", path, " failed");
  if (rows.empty()) fail(path, " holds no steps; the run wrote nothing yet");

  std::set<std::string> keys;
  for (const auto& r : rows)
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "step" && (it.value().is_number() || it.value().is_boolean() || it.value().is_null()))
        keys.insert(it.key());
  for (const auto& k : keys) {
    auto& col = run.columns[k];
    col.assign(rows.size(), kNaN);
    for (size_t i = 0; i < rows.size(); ++i) {
      auto it = rows[i].find(k);
      if (it == rows[i].end()) continue;
      if (it->is_number()) col[i] = it->get<double>();
      else if (it->is_boolean()) col[i] = it->get<bool>() ? 1 : 0;
    }
  }
  run.memory = read_json_file((fs::path(run_dir) / "memory.json").string());
  run.plan = read_json_file((fs::path(run_dir) / "plan.json").string());
  run.config = read_json_file((fs::path(run_dir) / "train_config.json").string());
  run.pipeline_timeline = last_json_line((fs::path(run_dir) / "pipeline_timeline.jsonl").string());
  run.restarts = json_lines((fs::path(run_dir) / "restarts.jsonl").string());
  return run;
}

}  // namespace shardlm::observe
