// `shardlm report RUN_DIR [--out FILE] [--watch [SECONDS]]`: writes one self-contained HTML page
// (inline SVG, no network) with the run's loss, throughput, learning rate, gradient norm, loss scale
// and skipped steps, memory per rank against plan.json, and time per step split into compute and
// exposed communication. --watch rewrites it while the run trains (report/report_watch.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "report/report.h"
#include "report/report_watch.h"

namespace shardlm::cli {

int run_report(int argc, char** argv) {
  CLI::App app{"Write a self-contained HTML report of a training run directory", "shardlm report"};
  std::string run_dir, out_file;
  int watch_s = 0;
  app.add_option("run_dir", run_dir, "training run directory (out_dir) holding metrics.jsonl")->required();
  app.add_option("--out", out_file, "HTML file to write (default: RUN_DIR/report.html)");
  app.add_option("--watch", watch_s,
                 "rewrite the report every SECONDS (default 10) while the run trains; stops when the run ends "
                 "or on Ctrl-C")
      ->expected(0, 1)
      ->default_str("10")
      ->check(CLI::Range(1, 86400));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (watch_s > 0)
    return observe::watch_report(run_dir, out_file, watch_s, [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
  const std::string path = observe::write_report(run_dir, out_file);
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace shardlm::cli
