// Reference runs that several multi-rank tests compare against, each trained once per test binary run:
// CI time. A training run is a function of its configuration (the seed is in it), so a run kept from
// an earlier test with the same configuration is the run this test would train again. The key is
// what the test built the configuration from (`inputs`: its layout, model overrides, precision...)
// together with the resolved configuration: train_config.json alone leaves out keys such as
// model.moe_capacity_factor, so it cannot tell every two runs apart.
// - run_once: a run of every rank (stage 0 for the ZeRO stages, a layout's straight run for its
//   resumes); every rank keeps its own part, and every rank asks for the same keys in the same order.
// - one_process_on_rank_0: the single-process run a layout is compared with, which only world rank 0
//   reads: it trains there alone (once), while the other ranks wait without spinning and without a
//   timeout (the run may take longer than comm.timeout_s on a loaded machine). Before, every rank
//   trained its own copy, N copies on a 2-core machine.
#pragma once
#include <mpi.h>

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "train/config.h"

namespace shardlm::test_support {

// What makes two runs the same run: `inputs`, the resolved configuration without the directory it
// writes to, and the test-only fp64 switch, which is not a config key.
inline std::string run_key(const std::string& inputs, const train::TrainConfig& cfg) {
  auto json = nlohmann::json::parse(train::config_to_json(cfg));
  json.erase("out_dir");
  return inputs + "\n" + json.dump() + (cfg.float64_for_tests ? " float64_for_tests" : "");
}

// Joins a test's list of overrides into its part of `inputs`.
inline std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += i + ";";
  return s;
}

// `train()`'s outcome for `cfg`, trained at the first call with these inputs and configuration and
// kept after. `inputs` names everything the run depends on (including the ranks it runs on when that
// is not the whole world).
template <class Outcome>
Outcome run_once(const std::string& inputs, const train::TrainConfig& cfg, const std::function<Outcome()>& train) {
  static std::map<std::string, Outcome> kept;
  const std::string key = run_key(inputs, cfg);
  auto it = kept.find(key);
  if (it == kept.end()) it = kept.emplace(key, train()).first;
  return it->second;
}

// World rank 0: `train()`'s outcome for `cfg` (trained once, as run_once). Other ranks: an empty
// outcome, returned when rank 0 has its outcome. `train` must not communicate beyond rank 0.
template <class Outcome>
Outcome one_process_on_rank_0(const std::string& inputs, const train::TrainConfig& cfg,
                              const std::function<Outcome()>& train) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Outcome o;
  std::exception_ptr failed;
  if (rank == 0) {
    try {
      o = run_once<Outcome>(inputs, cfg, train);
    } catch (...) {
      failed = std::current_exception();  // reach the barrier first, or the others would wait forever
    }
  }
  MPI_Request done;
  MPI_Ibarrier(MPI_COMM_WORLD, &done);
  for (int finished = 0; MPI_Test(&done, &finished, MPI_STATUS_IGNORE) == MPI_SUCCESS && !finished;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (failed) std::rethrow_exception(failed);
  return o;
}

}  // namespace shardlm::test_support
