// The pieces every report chart file shares (report_charts.cpp, report_charts_resources.cpp,
// report_charts_pipeline.cpp): the charts are split by what they show, and these keep them drawn alike.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "report/svg_chart.h"

namespace shardlm::observe::report_detail {

// The lowest and highest finite value at each step over several series of n steps (NaN where none
// is finite): a band drawn where one line per series would be too many.
std::pair<std::vector<double>, std::vector<double>> lowest_and_highest(const std::vector<std::vector<double>>& series,
                                                                       size_t n);
// One chart panel: its SVG and the note under it.
std::string section(const std::string& svg, const std::string& note_html);
// The x axis of every per-step chart.
svg::AxisSpec step_axis();

}  // namespace shardlm::observe::report_detail
