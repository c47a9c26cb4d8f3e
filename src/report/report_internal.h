// What the report_charts*.cpp files and report_page.cpp share (report.h has the public interface): the
// report is split by concern into the run loader (report_run.cpp), the charts and the page.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "report/report.h"

namespace shardlm::observe::report_detail {

// Steps the loss scaler skipped: `skipped` = 1, or (without that column) a null grad_norm.
std::vector<double> skipped_steps(const RunData& run);
// The config value at a JSON pointer as text ("–" when absent).
std::string config_text(const std::optional<nlohmann::json>& cfg, const std::string& pointer);

}  // namespace shardlm::observe::report_detail
