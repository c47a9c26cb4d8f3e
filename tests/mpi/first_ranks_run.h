// A training run on the first N ranks of the MPI world (the others wait), read back for bit-for-bit
// comparisons of layouts and resumes: its step metrics, and on its rank 0 the saved weights and
// memory.json. Shared by the suites that hold a sharded run equal to one process (compact optimizer
// states, bf16 master weights).
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "io/safetensors.h"
#include "train/trainer.h"

namespace shardlm::test_support {

struct RunOutcome {
  std::vector<observe::StepMetrics> history;
  io::NamedTensors weights;  // the group's rank 0 only
  nlohmann::json memory;     // the group's rank 0 only
};

// `config` trains into `dir` (its out_dir); `label` names the split of the world.
inline RunOutcome train_on_first_ranks(int ranks, const train::TrainConfig& config, const std::string& dir,
                                       const std::string& label) {
  auto world = comm::mpi_world();
  auto group = world->split(world->rank() < ranks ? 0 : 1, world->rank(), label);
  RunOutcome o;
  if (world->rank() < ranks) {
    train::Trainer trainer(config, group, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
    o.history = trainer.run().history;
    group->barrier();
    if (group->rank() == 0) {
      o.weights = io::load_safetensors(dir + "/model.safetensors");
      std::ifstream(dir + "/memory.json") >> o.memory;
    }
  }
  world->barrier();
  return o;
}

// The same losses step for step (a's first skip_a steps left out: b resumed after them) and the same
// final weights, bit for bit.
inline void expect_identical_runs(const RunOutcome& a, const RunOutcome& b, const std::string& what, size_t skip_a = 0) {
  ASSERT_EQ(a.history.size(), b.history.size() + skip_a) << what;
  for (size_t i = 0; i < b.history.size(); ++i)
    EXPECT_EQ(a.history[skip_a + i].loss, b.history[i].loss) << what << " step " << b.history[i].step;
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t k = 0; k < a.weights.size(); ++k)
    EXPECT_TRUE(at::equal(a.weights[k].second, b.weights[k].second))
        << what << " " << a.weights[k].first << " differs by "
        << (a.weights[k].second.to(at::kFloat) - b.weights[k].second.to(at::kFloat)).abs().max().item<double>();
}

}  // namespace shardlm::test_support
