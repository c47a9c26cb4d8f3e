// `shardlm diagnose RUN_DIR [--json]`: what went wrong in a run that hung or crashed, from the
// flight records its ranks wrote (comm/flight_recorder.h; observe/flight_diagnosis.h has the rules).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "observe/flight_diagnosis.h"
#include "util/error.h"

namespace shardlm::cli {

int run_diagnose(int argc, char** argv) {
  const char* usage =
      "usage: shardlm diagnose RUN_DIR [--json]\n"
      "  Merges RUN_DIR/flight_recorder/rank<N>.json, the last collectives of each rank (written on a\n"
      "  timeout, a fatal signal, an error, or on request: `touch RUN_DIR/flight_recorder/dump_request`\n"
      "  makes every rank of a running job write its record), and names the first point where the ranks\n"
      "  disagree: a desync (different operations at the same collective number, both call sites named)\n"
      "  or a stuck rank (absent from a collective the others started, with its last operation).\n"
      "  A run with flight_recorder.enabled false kept no records: diagnose says so.\n"
      "  --json   print the diagnosis as JSON\n";
  std::string dir;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (a == "--json") as_json = true;
    else if (!a.empty() && a[0] == '-') fail("unknown option '", a, "'\n", usage);
    else if (dir.empty()) dir = a;
    else fail("one run directory expected, got '", dir, "' and '", a, "'\n", usage);
  }
  if (dir.empty()) fail("RUN_DIR is required\n", usage);
  const auto diagnosis = observe::diagnose_flight_records(observe::read_flight_records(dir));
  if (as_json) std::printf("%s\n", diagnosis.to_json().dump(2).c_str());
  else std::printf("%s", diagnosis.summary().c_str());
  return 0;
}

}  // namespace shardlm::cli
