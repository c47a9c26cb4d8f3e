// `shardlm diagnose RUN_DIR`: reads every rank's flight record (comm/flight_recorder.h) and names
// what went wrong, the way PyTorch's flight-recorder trace analyzer does:
//   - desync: at some collective number of a communicator, its members called different
//     operations (another op, element type or count, or root) — both calls named with what each
//     rank was doing;
//   - stuck: some members started collective #k and the others never did — each absent rank named
//     with its last recorded operation and its state; likewise a send whose receive never came;
//   - crash: a rank wrote its record on a fatal signal or an error;
//   - no dump: a member wrote no file (killed before it could, or its recorder was off).
// Findings are ordered by time; the first is the likely cause, the rest its consequences.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::observe {

struct FlightFinding {
  std::string kind;      // "crash" | "desync" | "stuck" | "unmatched_send" | "unmatched_recv" | "in_progress"
  std::string comm;      // communicator name
  long long match_seq = 0;
  double t = 0;          // when the earliest operation involved started
  std::string message;   // one paragraph, ranks and call sites named
};

struct FlightDiagnosis {
  int world_size = 0;
  std::vector<int> ranks_with_dump, ranks_without_dump;
  std::vector<std::string> dump_reasons;  // per rank with a dump, "rank R: <reason>"
  std::vector<FlightFinding> findings;     // by time
  std::string summary() const;             // the text `shardlm diagnose` prints
  nlohmann::json to_json() const;
};

// `dumps`: each rank's JSON as FlightRecorder::to_json writes it. world_size 0: from the dumps.
FlightDiagnosis diagnose_flight_records(const std::vector<nlohmann::json>& dumps, int world_size = 0);

// Reads DIR/flight_recorder/rank*.json (or DIR/rank*.json when DIR is that directory itself).
// Fails naming the directory when there is none, and saying the recorder was off when DIR's
// train_config.json has flight_recorder.enabled false.
std::vector<nlohmann::json> read_flight_records(const std::string& dir);

}  // namespace shardlm::observe
