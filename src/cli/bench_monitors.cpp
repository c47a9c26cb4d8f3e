// `shardlm bench monitors --metrics FILE [--records N] [--repeats R]`: what the TensorBoard and CSV
// monitors (observe/monitors.h) cost per step, timed on this machine: a real run's metrics.jsonl
// records are written again, N of them per repeat, through the TensorBoard event writer and the CSV
// monitor into a scratch directory, each record flushed (log_interval 1, the most writes there are).
// bench/monitor_cost.py multiplies the cost per record by the records per step (one) and divides by
// the run's step time. One process, nothing else running.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "observe/csv_monitor.h"
#include "observe/monitors.h"
#include "observe/tensorboard_writer.h"
#include "util/error.h"

namespace shardlm::cli {
namespace fs = std::filesystem;

namespace {

std::vector<observe::StepMetrics> read_records(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("bench monitors: cannot read --metrics '", path, "'");
  std::vector<observe::StepMetrics> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    observe::StepMetrics m;
    for (const auto& [k, v] : j.items()) {
      const double x = v.is_number() ? v.get<double>() : NAN;
      if (k == "step") m.step = v.get<int64_t>();
      else if (k == "loss") m.loss = x;
      else if (k == "lr") m.lr = x;
      else if (k == "grad_norm") m.grad_norm = x;
      else if (k == "tokens_per_s") m.tokens_per_s = x;
      else if (k == "step_time_s") m.step_time_s = x;
      else if (k == "val_loss") m.val_loss = x;
      else if (v.is_number() || v.is_null()) m.extra[k] = x;
    }
    out.push_back(m);
  }
  if (out.empty()) fail("bench monitors: no records in '", path, "'");
  return out;
}

}  // namespace

int run_bench_monitors(int argc, char** argv) {
  CLI::App app{"microseconds per step record written (and flushed) as TensorBoard events and as CSV rows;\n"
               "median, min, max of R repeats.",
               "shardlm bench monitors"};
  std::string metrics;
  int64_t records = 2000;
  int repeats = 5;
  app.add_option("--metrics", metrics, "a run's step records (RUN/metrics.jsonl)")->required()->type_name("FILE");
  app.add_option("--records", records, "records written per repeat (2000)")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--repeats", repeats, "repeats; median, min and max are printed (5)")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto steps = read_records(metrics);
  const fs::path scratch = fs::temp_directory_path() / ("shardlm_bench_monitors_" + std::to_string(getpid()));
  const auto time_us = [&](bool tensorboard) {
    fs::remove_all(scratch);
    const auto t0 = std::chrono::steady_clock::now();
    if (tensorboard) {
      observe::TensorBoardWriter w((scratch / "tb").string(), 1);
      for (int64_t i = 0; i < records; ++i) {
        observe::StepMetrics m = steps[i % steps.size()];
        m.step = i + 1;
        observe::Scalars scalars;  // as monitors.cpp's TensorBoardSink tags them
        for (const auto& [field, v] : observe::numeric_fields(m)) scalars.emplace_back(observe::monitor_tag(field), v);
        w.add_scalars(m.step, scalars);
        w.flush();
      }
    } else {
      observe::CsvMonitor csv((scratch / "csv").string(), 0);
      for (int64_t i = 0; i < records; ++i) {
        observe::StepMetrics m = steps[i % steps.size()];
        m.step = i + 1;
        csv.write(m);
        csv.flush();
      }
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / records;
  };
  time_us(true), time_us(false);  // warm the page cache and the allocator
  std::vector<double> tb, csv;
  for (int r = 0; r < repeats; ++r) tb.push_back(time_us(true)), csv.push_back(time_us(false));
  fs::remove_all(scratch);
  std::printf("monitors: %zu fields per record (from %s), %lld records per repeat, each flushed\n",
              observe::numeric_fields(steps.front()).size(), metrics.c_str(), static_cast<long long>(records));
  const auto report = [](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%-22s median %8.2f us  min %8.2f  max %8.2f  (%zu repeats)\n", what, v[v.size() / 2], v.front(),
                v.back(), v.size());
  };
  report("tensorboard per record", tb);
  report("csv per record", csv);
  return 0;
}

}  // namespace shardlm::cli
