// bf16 master weights under ZeRO (optimizer.master_precision "bf16", optim/master_format.h): the update
// of an element depends only on that element (Kahan's compensation is per element; stochastic rounding
// draws its bits from (seed, step, parameter, element index in the whole parameter)), so ZeRO-1 and
// ZeRO-3 on 2 ranks train exactly as one rank on the same windows, and a checkpoint written on 2 ranks
// (bf16 masters, Kahan compensation by element range) resumes on 1 bit for bit. memory.json equals the
// planner's bytes: no fp32 masters, and Kahan's 2 bytes per parameter among the optimizer states.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "first_ranks_run.h"
#include "plan/planner.h"
#include "test_dirs.h"

using namespace shardlm;

namespace {

struct MasterRun {
  int ranks = 1, stage = 1;
  std::string rounding = "kahan";
  std::string name() const { return "bf16m_s" + std::to_string(stage) + "_" + rounding + "_n" + std::to_string(ranks); }
};

train::TrainConfig config(const MasterRun& r, int64_t steps, const std::string& dir, bool resume) {
  // Gradients of the two windows: summed in bf16 by the reduce-scatter on 2 ranks, by autograd's
  // accumulation on 1 (one rounding each); grad_accum_dtype bf16 keeps stage 3's shard in that dtype too.
  auto c = train::load_train_config(
      std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
      {"steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=60", "gradient_clipping=0",
       std::string("resume=") + (resume ? "true" : "false"), "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=" + std::to_string(std::max(1, 2 / r.ranks)), "optimizer.params.lr=3e-3",
       "zero_optimization.stage=" + std::to_string(r.stage), "zero_optimization.stage3_param_persistence_threshold=0",
       "model.num_hidden_layers=2", "bf16.enabled=true", "data_types.grad_accum_dtype=\"bf16\"",
       "optimizer.master_precision=\"bf16\"", "optimizer.master_rounding=\"" + r.rounding + "\""});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = dir;
  return c;
}

using test_support::expect_identical_runs;
using Outcome = test_support::RunOutcome;

// Trains on the first r.ranks world ranks (the others wait).
Outcome train_on(const MasterRun& r, int64_t steps, const std::string& dir, bool resume) {
  return test_support::train_on_first_ranks(r.ranks, config(r, steps, dir, resume), dir, "bf16_masters_test");
}

// On 2 ranks for 4 steps; on 1 rank for 4 steps; on 2 ranks for 2 steps, saved, resumed on 1 rank for
// 2 more. All three are the same run bit for bit (Kahan: the compensation reshards by element range;
// stochastic: the stream goes on from step 3 with the same element indices).
void expect_layouts_and_resume_agree(int stage, const std::string& rounding) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks against one";
  const MasterRun two{2, stage, rounding}, one{1, stage, rounding};
  const auto sharded = train_on(two, 4, test_support::mpi_test_path(two.name()), false);
  const auto single = train_on(one, 4, test_support::mpi_test_path(one.name()), false);
  const std::string dir = test_support::mpi_test_path(two.name() + "_reshard");
  train_on(two, 2, dir, false);
  const auto resumed = train_on(one, 4, dir, true);
  if (world->rank() != 0) return;
  const std::string what = "ZeRO-" + std::to_string(stage) + " bf16 masters (" + rounding + ")";
  expect_identical_runs(sharded, single, what + " on 2 ranks vs 1");
  expect_identical_runs(sharded, resumed, what + " saved on 2 ranks, resumed on 1", 2);
  EXPECT_GT(single.history.front().loss - single.history.back().loss, 0.1) << "the run should learn";
}

}  // namespace

TEST(Bf16Masters, Zero1StochasticOnTwoRanksEqualsOneRankAndResumesOnOne) {
  expect_layouts_and_resume_agree(1, "stochastic");
}
TEST(Bf16Masters, Zero3KahanOnTwoRanksEqualsOneRankAndResumesOnOne) { expect_layouts_and_resume_agree(3, "kahan"); }

// memory.json's master and optimizer bytes equal the planner's: no fp32 master; Kahan's compensation
// is 2 bytes per (padded) shard element beside the fp32 moments' 8.
TEST(Bf16Masters, MemoryJsonEqualsThePlan) {
  auto world = comm::mpi_world();
  const int n = world->size();
  for (const std::string rounding : {"kahan", "stochastic"}) {
    const MasterRun r{n, 2, rounding};
    const auto got = train_on(r, 1, test_support::mpi_test_path(r.name() + "_mem"), false);
    if (world->rank() != 0) continue;
    const auto cfg = config(r, 1, "", false);
    const auto masters = optim::parse_master_format("bf16", rounding);
    const auto planned = plan::model_state_bytes(cfg.model, 2, n, "bf16", "bf16", 0, 1, "fp32", 4096, false, masters);
    const auto fp32 = plan::model_state_bytes(cfg.model, 2, n, "bf16", "bf16", 0, 1, "fp32", 4096);
    EXPECT_EQ(got.memory["master_params"].get<int64_t>(), 0) << rounding;
    EXPECT_EQ(planned.master_params, 0) << rounding;
    EXPECT_EQ(planned.optimizer_states, got.memory["optimizer_states"].get<int64_t>()) << rounding;
    EXPECT_EQ(planned.optimizer_states, fp32.optimizer_states * (rounding == "kahan" ? 10 : 8) / 8) << rounding;
    EXPECT_EQ(planned.total() + fp32.master_params - (rounding == "kahan" ? fp32.master_params / 2 : 0), fp32.total())
        << rounding;
  }
}
