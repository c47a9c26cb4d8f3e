// debug.consistency_interval and debug.check_collectives in real training runs: clean runs of every
// strategy family (DDP, ZeRO-1/2/3, tensor, sequence and pipeline parallelism with a tied
// embedding) pass every check and follow the unchecked trajectory bit for bit; a one-ulp
// perturbation of one replica's parameter or gradient (parallel/fault_injection.h) stops every rank
// with the tensor, the step, the group and the ranks named.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/mpi_communicator.h"
#include "parallel/fault_injection.h"
#include "test_dirs.h"
#include "train/trainer.h"
#include "util/error.h"

using namespace shardlm;

namespace {

struct RunSpec {
  int tp = 1, pp = 1, stage = 0;
  bool sp = false, tied = false, debug = true;
  std::string precision = "fp32";
};

RunSpec spec(int tp, int pp, int stage, bool sp = false, bool tied = false, const std::string& precision = "fp32") {
  RunSpec r;
  r.tp = tp;
  r.pp = pp;
  r.stage = stage;
  r.sp = sp;
  r.tied = tied;
  r.precision = precision;
  return r;
}

train::TrainConfig config(const RunSpec& r, const std::string& tag) {
  auto c = train::load_train_config(
      std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
      {"steps=3", "data.val=", "threads=1", "comm.timeout_s=30", "resume=false", "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=2", "ddp.bucket_cap_mb=0.1", "zero_optimization.stage=" + std::to_string(r.stage),
       "zero_optimization.stage3_param_persistence_threshold=0", "model.num_hidden_layers=2",
       "parallelism.tensor_parallel=" + std::to_string(r.tp), "parallelism.pipeline_parallel=" + std::to_string(r.pp),
       "parallelism.sequence_parallel=" + std::string(r.sp ? "true" : "false"),
       "model.tie_word_embeddings=" + std::string(r.tied ? "true" : "false"),
       "debug.consistency_interval=" + std::string(r.debug ? "1" : "0"),
       "debug.check_collectives=" + std::string(r.debug ? "true" : "false"),
       "bf16.enabled=" + std::string(r.precision == "bf16" ? "true" : "false")});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = test_support::mpi_test_path("consistency_" + tag);
  return c;
}

std::vector<observe::StepMetrics> train_run(const RunSpec& r, const std::string& tag) {
  train::Trainer trainer(config(r, tag), comm::mpi_world(), /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  return trainer.run().history;
}

// The Error message a run stops with ("" when it finishes).
std::string failure_of(const RunSpec& r, const std::string& tag) {
  try {
    train_run(r, tag);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The Error message run `r` stops with when world rank `rank` moves the first element of `tensor`
// up by one ulp at 0-based optimizer step `step` (parallel/fault_injection.h): its gradient before
// the update, or its parameter after.
std::string failure_with_ulp(const RunSpec& r, const std::string& tag, int rank, int64_t step, bool gradient,
                             const std::string& tensor) {
  parallel::FaultInjection f;
  f.perturb_rank = rank;
  f.perturb_step = step;
  f.perturb_gradient = gradient;
  f.perturb_tensor = tensor;
  parallel::FaultScope scope(f);
  return failure_of(r, tag);
}

void expect_contains(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "expected \"" << part << "\" in: " << msg;
}

}  // namespace

TEST(Consistency, CleanRunsPassEveryCheckAndKeepTheirTrajectory) {
  const int n = comm::mpi_world()->size();
  std::vector<std::pair<std::string, RunSpec>> runs = {
      {"ddp", spec(1, 1, 0)},
      {"tp2_sp_zero2_bf16", spec(2, 1, 2, true, false, "bf16")},
      {"tp2_zero3", spec(2, 1, 3)},
      {"pp2_tied_zero1", spec(1, 2, 1, false, true)},
  };
  if (n >= 4) runs.push_back({"tp2_pp2_tied_ddp", spec(2, 2, 0, false, true)});
  if (n >= 4) runs.push_back({"tp4_shared_kv_heads_zero1", spec(4, 1, 1)});
  for (auto& [name, run] : runs) {
    SCOPED_TRACE(name);
    const auto checked = train_run(run, name + "_checked");
    run.debug = false;
    const auto plain = train_run(run, name + "_plain");
    ASSERT_EQ(checked.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {  // the checks read and exchange; they change nothing
      EXPECT_EQ(checked[i].loss, plain[i].loss) << "step " << i + 1;
      EXPECT_EQ(checked[i].grad_norm, plain[i].grad_norm) << "step " << i + 1;
    }
  }
}

TEST(Consistency, AnUlpOnOneDataParallelReplicasParameterIsNamed) {
  // World rank 1's parameter after the second step's update.
  const auto msg = failure_with_ulp(spec(1, 1, 0), "ulp_param", 1, 1, false, "model.layers.1.mlp.up_proj.weight");
  const int n = comm::mpi_world()->size();
  expect_contains(msg, "consistency check failed at step 2: parameters after the update differ across the "
                       "data-parallel group; first differing tensor model.layers.1.mlp.up_proj.weight");
  expect_contains(msg, std::string("world rank(s) 0") + (n == 4 ? ", 2, 3" : "") + " hold checksum");
  expect_contains(msg, "world rank(s) 1 hold checksum");
  expect_contains(msg, "(1 of ");
}

TEST(Consistency, AnUlpOnOneReplicasGradientIsNamedBeforeTheUpdate) {
  const auto msg = failure_with_ulp(spec(1, 1, 0), "ulp_grad", 0, 0, true, "model.embed_tokens.weight");
  expect_contains(msg, "consistency check failed at step 1: gradients before the update differ across the "
                       "data-parallel group; first differing tensor model.embed_tokens.weight");
}

TEST(Consistency, AnUlpOnOneTensorParallelCopyOfANormIsNamed) {
  // Rank 1: tp rank 1 of the first group.
  const auto msg = failure_with_ulp(spec(2, 1, 0, true), "ulp_tp", 1, 0, true,
                                    "model.layers.0.post_attention_layernorm.weight");
  // With 4 ranks, world rank 1's data-parallel peer (3) agrees with world rank 0's (2): the
  // tensor-parallel group {0, 1} reports it, and every rank stops with that message.
  expect_contains(msg, "gradients before the update differ across the tensor-parallel group; first differing "
                       "tensor model.layers.0.post_attention_layernorm.weight: world rank(s) 0 hold checksum");
}

TEST(Consistency, AnUlpOnOneTensorParallelCopyOfAZeroGradientShardIsNamed) {
  const int n = comm::mpi_world()->size();
  // Norms come last in a layer's unit: the last data-parallel rank's shard holds them; this is tp
  // rank 1 there (2 ranks: tp=2; 4 ranks: tp=2 x dp=2).
  const auto msg = failure_with_ulp(spec(2, 1, 2, true), "ulp_zero_tp", n - 1, 1, true,
                                    "model.layers.0.input_layernorm.weight");
  expect_contains(msg, "consistency check failed at step 2: gradients before the update differ across the "
                       "tensor-parallel group; first differing tensor model.layers.0.input_layernorm.weight");
  expect_contains(msg, "world rank(s) " + std::to_string(n - 1) + " hold checksum");
}

// Four TP ranks over the two KV heads: ranks {0, 1} hold KV head 0, {2, 3} KV head 1. An ulp on
// rank 1's copy is named by the KV-head group (the whole TP group holds two different heads).
TEST(Consistency, AnUlpOnOneCopyOfASharedKvHeadIsNamed) {
  if (comm::mpi_world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 4 over 2 KV heads)";
  const auto msg = failure_with_ulp(spec(4, 1, 0), "ulp_kv", 1, 0, true, "model.layers.1.self_attn.v_proj.weight");
  expect_contains(msg, "consistency check failed at step 1: gradients before the update differ across the KV-head "
                       "(tensor-parallel ranks sharing a KV head) group; first differing tensor "
                       "model.layers.1.self_attn.v_proj.weight: world rank(s) 0 hold checksum");
  expect_contains(msg, "world rank(s) 1 hold checksum");
}
