// Compact optimizer states under ZeRO (optimizer.state_precision, optim/quantized_state.h): 8-bit
// quantization blocks count from each parameter's element 0 whatever the sharding, and a block a
// shard boundary cuts is quantized with the whole block's absmax (zero_engine.cpp
// share_cut_quantization_blocks). So on 2 ranks, ZeRO 1-3 with 8-bit states train exactly as one
// rank does on the same windows (gradient clipping off: the norm's summation order is the only
// difference that would remain); a checkpoint written on 2 ranks (ZeRO-2 or DDP) resumes on 1 bit
// for bit as on the 2 that wrote it, and on 3 to summation-order rounding. Also: memory.json's
// optimizer bytes equal the planner's and are at most 0.3x of fp32 AdamW's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "first_ranks_run.h"
#include "plan/planner.h"
#include "test_dirs.h"
#include "../support/worst_of.h"

using namespace shardlm;

namespace {

struct StatesRun {
  int ranks = 1, stage = 1, windows = 2;
  std::string states = "8bit";
  int64_t min_8bit_size = 4096;
  std::string name() const {
    return "s" + std::to_string(stage) + "_" + states + "_n" + std::to_string(ranks) + "_w" + std::to_string(windows);
  }
};

train::TrainConfig config(const StatesRun& r, int64_t steps, const std::string& dir, bool resume) {
  auto c = train::load_train_config(
      std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
      {"steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=60", "gradient_clipping=0",
       std::string("resume=") + (resume ? "true" : "false"), "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=" + std::to_string(r.windows / r.ranks), "optimizer.params.lr=3e-3",
       "zero_optimization.stage=" + std::to_string(r.stage), "zero_optimization.stage3_param_persistence_threshold=0",
       "model.num_hidden_layers=2", "optimizer.state_precision=" + r.states,
       "optimizer.min_8bit_size=" + std::to_string(r.min_8bit_size)});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = dir;
  return c;
}

using test_support::expect_identical_runs;
using Outcome = test_support::RunOutcome;

// Trains on the first r.ranks world ranks (the others wait).
Outcome train_on(const StatesRun& r, int64_t steps, const std::string& dir, bool resume) {
  return test_support::train_on_first_ranks(r.ranks, config(r, steps, dir, resume), dir, "compact_states_test");
}

void expect_sharded_equals_one_rank(int stage) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks against one: the sum of two gradients has one rounding";
  const StatesRun two{2, stage, 2}, one{1, stage, 2};
  const auto sharded = train_on(two, 6, test_support::mpi_test_path("compact_" + two.name()), false);
  const auto single = train_on(one, 6, test_support::mpi_test_path("compact_" + one.name()), false);
  if (world->rank() != 0) return;
  expect_identical_runs(sharded, single, "ZeRO-" + std::to_string(stage) + " 8-bit on 2 ranks vs 1");
  EXPECT_GT(single.history.front().loss - single.history.back().loss, 0.1) << "the run should learn";
}

}  // namespace

TEST(CompactStates, Zero1EightBitOnTwoRanksEqualsOneRank) { expect_sharded_equals_one_rank(1); }
TEST(CompactStates, Zero2EightBitOnTwoRanksEqualsOneRank) { expect_sharded_equals_one_rank(2); }
TEST(CompactStates, Zero3EightBitOnTwoRanksEqualsOneRank) { expect_sharded_equals_one_rank(3); }

// Saved on 2 ranks after 2 steps, resumed on 1 for 2 more: the same losses and weights as the
// straight 4-step run on 2 ranks, bit for bit (codes and block absmax values reshard exactly).
TEST(CompactStates, EightBitCheckpointFromTwoRanksResumesOnOneBitForBit) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks against one";
  const StatesRun two{2, 2, 2}, one{1, 2, 2};
  const auto straight = train_on(two, 4, test_support::mpi_test_path("compact_ckpt_straight"), false);
  const std::string dir = test_support::mpi_test_path("compact_ckpt_reshard");
  train_on(two, 2, dir, false);
  const auto resumed = train_on(one, 4, dir, true);
  if (world->rank() != 0) return;
  expect_identical_runs(straight, resumed, "resumed on 1 rank", 2);
}

// memory.json's optimizer states equal the planner's (the most any rank holds), and the 8-bit
// moments take at most 0.3x of fp32 AdamW's bytes. min_8bit_size 1024 quantizes the tiny model's k
// and v (2048 elements) too, as 4096 does for a real model's: only the 64-element norms keep fp32.
TEST(CompactStates, MemoryJsonEqualsThePlanAndEightBitIsUnderAThird) {
  auto world = comm::mpi_world();
  const int n = world->size();
  std::map<std::string, int64_t> bytes;
  for (const std::string states : {"fp32", "bf16", "8bit"}) {
    const StatesRun r{n, 2, 2 * n, states, 1024};
    const auto got = train_on(r, 1, test_support::mpi_test_path("compact_mem_" + r.name()), false);
    if (world->rank() != 0) continue;
    const auto cfg = config(r, 1, "", false);
    const auto planned = plan::model_state_bytes(cfg.model, 2, n, "fp32", "fp32", 0, 1, states, 1024);
    EXPECT_EQ(planned.optimizer_states, got.memory["optimizer_states"].get<int64_t>()) << states;
    bytes[states] = got.memory["optimizer_states"].get<int64_t>();
  }
  if (world->rank() != 0) return;
  EXPECT_EQ(bytes["bf16"] * 2, bytes["fp32"]);
  const double ratio = static_cast<double>(bytes["8bit"]) / bytes["fp32"];
  EXPECT_LE(ratio, 0.3);
  std::printf("[ compact  ] optimizer state bytes per rank (%d ranks, ZeRO-2, tiny model): fp32 %lld, bf16 %lld, "
              "8bit %lld (%.3fx of fp32)\n",
              n, static_cast<long long>(bytes["fp32"]), static_cast<long long>(bytes["bf16"]),
              static_cast<long long>(bytes["8bit"]), ratio);
}

// Saved on 2 ranks, resumed on 3 (blocks cut at other places, the absmax values read back from the
// pieces the 2 ranks wrote): the resumed trajectory continues the straight 2-rank run. Not bit for
// bit: 3 ranks sum the 6 windows' gradients in another order (one rounding), which can move an 8-bit
// code across a rounding boundary; a wrong state (an absmax from the wrong block, or none) moves the
// weights by about the step size instead (the bound is far below that, far above the rounding).
TEST(CompactStates, EightBitCheckpointFromTwoRanksResumesOnThree) {
  auto world = comm::mpi_world();
  if (world->size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const StatesRun two{2, 2, 6}, three{3, 2, 6};
  const auto straight = train_on(two, 4, test_support::mpi_test_path("compact_ckpt3_straight"), false);
  const std::string dir = test_support::mpi_test_path("compact_ckpt3_reshard");
  train_on(two, 2, dir, false);
  const auto resumed = train_on(three, 4, dir, true);
  if (world->rank() != 0) return;
  ASSERT_EQ(resumed.history.size(), 2u);
  double loss = 0, weights = 0;
  for (size_t i = 0; i < 2; ++i)
    loss = test_support::worst_of(loss, std::abs(resumed.history[i].loss - straight.history[2 + i].loss) / straight.history[2 + i].loss);
  for (size_t k = 0; k < straight.weights.size(); ++k) {
    const auto a = resumed.weights[k].second.to(at::kDouble), b = straight.weights[k].second.to(at::kDouble);
    weights = test_support::worst_of(weights, ((a - b).norm() / b.norm()).item<double>());
  }
  std::printf("[ compact  ] 2 -> 3 ranks, after resume: worst relative deviation loss %.2e, final weights %.2e\n", loss,
              weights);
  EXPECT_LT(loss, 1e-5);
  EXPECT_LT(weights, 1e-4);
}

// Data parallelism (stage 0) keeps whole parameters: its 8-bit checkpoint (pieces from element 0,
// written once by data-parallel rank 0) resumes under ZeRO-2 on one rank as the straight DDP run
// continues, bit for bit.
TEST(CompactStates, EightBitDdpCheckpointResumesUnderZero2OnOneRank) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks against one";
  const StatesRun ddp{2, 0, 2}, one{1, 2, 2};
  const auto straight = train_on(ddp, 4, test_support::mpi_test_path("compact_ddp_straight"), false);
  const std::string dir = test_support::mpi_test_path("compact_ddp_reshard");
  train_on(ddp, 2, dir, false);
  const auto resumed = train_on(one, 4, dir, true);
  if (world->rank() != 0) return;
  expect_identical_runs(straight, resumed, "DDP checkpoint resumed under ZeRO-2 on 1 rank", 2);
}
