// `shardlm report RUN_DIR [--out FILE]`: writes one self-contained HTML page (inline SVG, no network)
// with the run's loss, throughput, learning rate, gradient norm, loss scale and skipped steps, memory
// per rank against plan.json, and time per step split into compute and exposed communication.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "observe/report.h"

namespace shardlm::cli {

int run_report(int argc, char** argv) {
  CLI::App app{"Write a self-contained HTML report of a training run directory", "shardlm report"};
  std::string run_dir, out_file;
  app.add_option("run_dir", run_dir, "training run directory (out_dir) holding metrics.jsonl")->required();
  app.add_option("--out", out_file, "HTML file to write (default: RUN_DIR/report.html)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::string path = observe::write_report(run_dir, out_file);
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace shardlm::cli
