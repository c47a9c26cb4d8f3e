// `shardlm diagnose RUN_DIR [--json]`: what went wrong in a run that hung or crashed, from the
// flight records its ranks wrote (comm/flight_recorder.h; report/flight_diagnosis.h has the rules).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "report/flight_diagnosis.h"

namespace shardlm::cli {

int run_diagnose(int argc, char** argv) {
  CLI::App app{"Explain a hang or crash from the flight records of a run's ranks.\n"
               "Merges RUN_DIR/flight_recorder/rank<N>.json, the last collectives of each rank (written on a\n"
               "timeout, a fatal signal, an error, or on request: `touch RUN_DIR/flight_recorder/dump_request`\n"
               "makes every rank of a running job write its record), and names the first point where the ranks\n"
               "disagree: a desync (different operations at the same collective number, both call sites named)\n"
               "or a stuck rank (absent from a collective the others started, with its last operation).\n"
               "A run with flight_recorder.enabled false kept no records: diagnose says so.",
               "shardlm diagnose"};
  std::string dir;
  bool as_json = false;
  app.add_option("run_dir", dir, "the run directory (out_dir) whose flight_recorder/ to read")->required();
  app.add_flag("--json", as_json, "print the diagnosis as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto diagnosis = observe::diagnose_flight_records(observe::read_flight_records(dir));
  if (as_json) std::printf("%s\n", diagnosis.to_json().dump(2).c_str());
  else std::printf("%s", diagnosis.summary().c_str());
  return 0;
}

}  // namespace shardlm::cli
