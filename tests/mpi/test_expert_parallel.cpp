// Expert parallelism (parallel/expert/): the expert-parallel groups ParallelDims carves out of the
// data-parallel ranks, and training a tiny Mixtral (with its load-balancing loss) and a tiny
// Qwen2-MoE (shared expert, a dense layer) with the experts split over ep ranks reproduces one
// process training alone on the same token windows (docs/data.md, Data order), step by step (loss, grad
// norm) and in the final, gathered HF weights. On 2 ranks ep=2 (every dp rank its own EP rank, edp
// of one); on 4 ranks ep=2 x edp=2 and ep=4. fp64 shows the same function is computed (differences
// are summation order only); fp32 holds the bounds of the other layouts' tests.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model_parallel.h"
#include "comm/mpi_communicator.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "parallel/parallel_dims.h"
#include "plan/planner.h"
#include "reference_runs.h"
#include "test_dirs.h"
#include "trajectory.h"
#include "train/trainer.h"
#include "../support/error_of.h"

using namespace shardlm;

namespace {

using model_parallel::kMixtralAux;
using model_parallel::kQwen2Moe;

train::TrainConfig config(const std::vector<std::string>& model, int ep, int stage, int64_t accumulation,
                          const std::string& precision, const std::string& tag, int64_t steps = 8,
                          bool resume = false, const std::vector<std::string>& layout = {}) {
  std::vector<std::string> overrides = {
      "steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=30", "gradient_clipping=0.5",
      std::string("resume=") + (resume ? "true" : "false"),
      "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=" + std::to_string(accumulation),
      "optimizer.params.lr=3e-3", "ddp.bucket_cap_mb=0.1", "zero_optimization.stage=" + std::to_string(stage),
      "zero_optimization.stage3_param_persistence_threshold=0", "model.num_hidden_layers=2",
      "parallelism.expert_parallel=" + std::to_string(ep)};
  overrides.insert(overrides.end(), model.begin(), model.end());
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = precision == "fp64";
  if (precision == "fp32") c.optimizer.lr = 1e-3;  // as model_parallel.cpp: Adam's first steps
  c.out_dir = test_support::mpi_test_path("ep_" + tag);
  return c;
}


test_support::Outcome train_ep(const train::TrainConfig& cfg, comm::CommPtr comm) {
  train::Trainer trainer(cfg, comm, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  test_support::Outcome o;
  o.history = trainer.run().history;
  // The experts really are split: this rank holds E/ep of every sparse layer's experts.
  const int64_t E = trainer.model().config().num_experts, ep = cfg.parallelism.expert_parallel;
  int64_t expert_tensors = 0;
  for (const auto& p : trainer.model().parameters())
    if (p.name.find("mlp.experts.") != std::string::npos && p.tensor.numel() > 0) {
      EXPECT_EQ(p.tensor.size(0), E / ep) << p.name;
      ++expert_tensors;
    }
  EXPECT_GT(expert_tensors, 0);
  comm->barrier();  // its rank 0 has written the files
  if (comm->rank() == 0) o.weights = io::load_safetensors(cfg.out_dir + "/model.safetensors");
  return o;
}

test_support::Deviation compare(const test_support::Outcome& got, const test_support::Outcome& ref) {
  return test_support::deviation_of(got, ref, [&](size_t i) {
    EXPECT_GT(test_support::expect_same_routing(got, ref, i), 0) << "the MoE metrics are missing";
  });
}

// Trains on the whole world with the experts over `ep` ranks and compares with one process reading
// the same windows (accumulation x dp micro-batches of the same size).
// layout: more parallelism.* overrides (tensor and pipeline parallelism), whose ranks the data-
// parallel ones are what is left of. run (when not null) receives the run (its weights on rank 0).
void expect_reproduces_single_process(const std::string& family, const std::vector<std::string>& model, int ep,
                                      int stage, const std::string& precision,
                                      const std::vector<std::string>& layout = {}, test_support::Outcome* run = nullptr) {
  auto world = comm::mpi_world();
  const auto p = config(model, ep, stage, 1, precision, "ranks", 8, false, layout).parallelism;
  const int dp = world->size() / (p.tensor_parallel * p.pipeline_parallel);
  if (dp % ep != 0) GTEST_SKIP() << "needs a multiple of " << ep << " ranks";
  const std::string name = family + "_ep" + std::to_string(ep) + "_zero" + std::to_string(stage) + "_" + precision;
  const int64_t accumulation = 2;
  auto self = world->split(world->rank(), 0, "self");
  // One process's run, on world rank 0 (which compares), once per configuration (reference_runs.h).
  const auto single = config(model, 1, 0, accumulation * dp, precision, "single_" + name);
  const std::string inputs = test_support::joined(model) + " " + precision + " accumulation " +
                             std::to_string(accumulation * dp);
  const auto ref = test_support::one_process_on_rank_0<test_support::Outcome>(inputs, single, [&] { return train_ep(single, self); });
  const auto got = train_ep(config(model, ep, stage, accumulation, precision, name, 8, false, layout), world);
  if (run) *run = got;
  if (world->rank() != 0) return;
  const auto d = compare(got, ref);
  // fp32: the other layouts' bounds (tests/mpi/model_parallel.cpp) except the final weights:
  // this Qwen2-MoE's fp32 weights drift from one process by 3.4e-5 (DDP) and 4.3e-5 (ZeRO-2) on 2
  // ranks without expert parallelism too (Adam's sign-like steps on near-zero gradients), 5.5e-5 with
  // it; fp64 shows the layouts compute the same function.
  const bool fp64 = precision == "fp64";
  EXPECT_LT(d.loss, fp64 ? 1e-12 : 1e-6) << name;
  EXPECT_LT(d.grad_norm, fp64 ? 1e-10 : 3e-5) << name;
  EXPECT_LT(d.weights, fp64 ? 5e-12 : 1.5e-4) << name;
  EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 0.1) << "the reference run should learn";
  // Every token's top-k assignments of every sparse layer are counted once: 2 x 32 tokens x top-2 x
  // sparse layers x micro-batches of the step (those a capacity dropped included).
  const auto& cfg = config(model, 1, 0, accumulation * dp, precision, "count").model;
  int64_t sparse = 0;
  for (int64_t layer = 0; layer < cfg.num_hidden_layers; ++layer) sparse += cfg.is_moe_layer(layer);
  double counted = ref.history.front().extra.at("moe_dropped_tokens");
  for (int64_t e = 0; e < cfg.num_experts; ++e) counted += ref.history.front().extra.at("moe_tokens_expert_" + std::to_string(e));
  EXPECT_EQ(counted, static_cast<double>(2 * 32 * cfg.num_experts_per_tok * sparse * accumulation * dp));
  double dropped = 0;
  for (const auto& h : ref.history) dropped += h.extra.at("moe_dropped_tokens");
  if (cfg.moe_capacity_factor > 0) EXPECT_GT(dropped, 0) << "the capacity should drop assignments";
  else EXPECT_EQ(dropped, 0);
  std::printf("[ expert-parallel ] %-32s dp=%d ep=%d: worst relative deviation from one process: loss %.2e, "
              "grad norm %.2e, final weights %.2e\n",
              name.c_str(), dp, ep, d.loss, d.grad_norm, d.weights);
}

// Saves after 4 steps with the experts over `from` ranks (ZeRO stage from_stage), resumes on `to`
// (to_stage) for 4 more: the trajectory continues the uninterrupted 8-step run of `from` (the
// checkpoint's expert pieces are element ranges of the whole tensors, read back on any ep).
// layout and straight: the 3D grid's tensor and pipeline overrides (both runs) and its
// uninterrupted run, when the caller has it.
void expect_reshard_continues(const std::vector<std::string>& model, int from, int from_stage, int to, int to_stage,
                              const std::vector<std::string>& layout = {}, const test_support::Outcome* straight_run = nullptr) {
  auto world = comm::mpi_world();
  if (world->size() % from != 0 || world->size() % to != 0) GTEST_SKIP() << "needs a multiple of " << from << " and " << to;
  const std::string name = "ep" + std::to_string(from) + "_zero" + std::to_string(from_stage) + "_to_ep" +
                           std::to_string(to) + "_zero" + std::to_string(to_stage) + (layout.empty() ? "" : "_3d");
  const auto straight =
      straight_run ? *straight_run : train_ep(config(model, from, from_stage, 2, "fp64", "straight_" + name), world);
  const std::string dir = "resumed_" + name;
  train_ep(config(model, from, from_stage, 2, "fp64", dir, 4, false, layout), world);
  const auto resumed = train_ep(config(model, to, to_stage, 2, "fp64", dir, 8, true, layout), world);
  if (world->rank() != 0) return;
  ASSERT_EQ(resumed.history.size(), 4u) << name;
  double loss = 0;
  for (size_t i = 0; i < 4; ++i) {
    const auto& ref = straight.history[4 + i];
    EXPECT_EQ(resumed.history[i].step, ref.step);
    loss = test_support::worst_of(loss, std::abs(resumed.history[i].loss - ref.loss) / ref.loss);
  }
  test_support::Outcome r = resumed, s = straight;
  const auto d = compare(test_support::Outcome{{}, r.weights}, test_support::Outcome{{}, s.weights});
  EXPECT_LT(loss, 1e-12) << name;
  EXPECT_LT(d.weights, 5e-12) << name;
  std::printf("[ expert-parallel ] %s: after resume, worst relative deviation loss %.2e, final weights %.2e\n",
              name.c_str(), loss, d.weights);
}

using shardlm::test_support::error_of;

}  // namespace

// ep consecutive dp ranks form an EP group; the ranks at the same EP position across groups form
// the expert-data-parallel group (parallel_dims.h).
TEST(ExpertParallel, GroupsAreCarvedOutOfTheDataParallelRanks) {
  auto world = comm::mpi_world();
  const int n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const auto d = parallel::ParallelDims::build(world, 0, 1, 1, 0, 2);
  EXPECT_EQ(d.ep, 2);
  EXPECT_EQ(d.ep_comm->size(), 2);
  EXPECT_EQ(d.ep_comm->rank(), world->rank() % 2);
  EXPECT_EQ(d.edp_comm->size(), n / 2);
  EXPECT_EQ(d.edp_comm->rank(), world->rank() / 2);
  auto t = at::tensor({static_cast<double>(world->rank())}, at::kDouble);
  d.ep_comm->all_reduce(t);
  EXPECT_EQ(t.item<double>(), 2 * (world->rank() / 2) * 2 + 1);  // {2g, 2g+1}
  auto u = at::tensor({static_cast<double>(world->rank())}, at::kDouble);
  d.edp_comm->all_reduce(u);
  double expected = 0;
  for (int r = world->rank() % 2; r < n; r += 2) expected += r;
  EXPECT_EQ(u.item<double>(), expected);
  const auto none = parallel::ParallelDims::build(world, 0, 1, 1);
  EXPECT_EQ(none.ep, 1);
  EXPECT_FALSE(none.ep_comm);
  EXPECT_EQ(none.edp_comm, none.dp_comm);
  // Refused: ep not dividing dp, and an EP group across shard groups (ep not dividing the shard).
  const auto odd = error_of([&] { parallel::ParallelDims::build(world, 0, 1, 1, 0, 3); });
  EXPECT_NE(odd.find("parallelism.expert_parallel = 3 does not divide the " + std::to_string(n) + " data-parallel"),
            std::string::npos)
      << odd;
  if (n >= 4) {
    const auto across = error_of([&] { parallel::ParallelDims::build(world, 0, 1, 1, 1, 2); });
    EXPECT_NE(across.find("must lie inside one shard group of 1 data-parallel ranks"), std::string::npos) << across;
    // Shards of 2 with ep 2: the experts' shard group is one rank, their replicas the edp group.
    const auto h = parallel::ParallelDims::build(world, 0, 1, 1, 2, 2);
    EXPECT_EQ(h.eshard_comm->size(), 1);
    EXPECT_EQ(h.ereplica_comm->size(), n / 2);
    EXPECT_EQ(h.ereplica_comm->rank(), world->rank() / 2);
  }
}

// Ep 2 variants run on 2 ranks (one expert-parallel group); on 4 ranks (two groups, experts
// data-parallel over edp 2) ZeRO-3, hybrid sharding and ep 4 cover the layout (CI time).
#define EP2_VARIANT_ON_TWO_RANKS() \
  if (comm::mpi_world()->size() != 2) GTEST_SKIP() << "ep 2 variant: 2 ranks (4 ranks: ZeRO-3, hybrid, ep 4)"
TEST(ExpertParallel, Ep2MixtralWithAuxLossReproducesOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  expect_reproduces_single_process("mixtral", kMixtralAux, 2, 0, "fp64");
}
TEST(ExpertParallel, Ep2MixtralFp32ReproducesOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  expect_reproduces_single_process("mixtral", kMixtralAux, 2, 0, "fp32");
}
TEST(ExpertParallel, Ep2Qwen2MoeReproducesOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  expect_reproduces_single_process("qwen2_moe", kQwen2Moe, 2, 0, "fp64");
}
TEST(ExpertParallel, Ep4Qwen2MoeReproducesOneProcess) {
  expect_reproduces_single_process("qwen2_moe", kQwen2Moe, 4, 0, "fp64");
}

// GShard capacity (model.moe_capacity_factor): dropped where the tokens are, before the dispatch,
// over each rank's micro-batch, as one process drops them over the same micro-batch.
TEST(ExpertParallel, Ep2MixtralWithCapacityDropsAsOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  auto capped = kMixtralAux;
  capped.push_back("model.moe_capacity_factor=1.0");
  expect_reproduces_single_process("mixtral_capacity", capped, 2, 0, "fp64");
}

// ZeRO: the experts in an engine of their own, sharded over edp (parallel/expert/expert_zero.h).
TEST(ExpertParallel, Ep2MixtralWithZero3ReproducesOneProcess) {
  expect_reproduces_single_process("mixtral", kMixtralAux, 2, 3, "fp64");
}
TEST(ExpertParallel, Ep2Qwen2MoeWithZero1ReproducesOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  expect_reproduces_single_process("qwen2_moe", kQwen2Moe, 2, 1, "fp64");
}
TEST(ExpertParallel, Ep2Qwen2MoeWithZero2ReproducesOneProcess) {
  EP2_VARIANT_ON_TWO_RANKS();
  expect_reproduces_single_process("qwen2_moe", kQwen2Moe, 2, 2, "fp64");
  expect_reproduces_single_process("qwen2_moe", kQwen2Moe, 2, 2, "fp32");
}
TEST(ExpertParallel, Ep4MixtralWithZero3ReproducesOneProcess) {
  expect_reproduces_single_process("mixtral", kMixtralAux, 4, 3, "fp64");
}

// The grid with every axis (8 ranks): tp 2 x dp 2 (one EP group of 2) x pp 2 in parallel_dims.h's
// rank order, ZeRO-3 over both engines (the experts' sharded over edp of 1), Mixtral's one sparse
// layer per stage, fp64: reproduces one process; its checkpoint after 4 steps resumes with the
// experts on every rank (ep 1, same tp and pp) and continues the uninterrupted run.
const std::vector<std::string> kMixtral = {"model.model_type=mixtral", "model.num_local_experts=4",
                                           "model.num_experts_per_tok=2", "model.intermediate_size=64"};
TEST(ExpertParallel, ThreeDimensionalGridReproducesOneProcessAndResumesOnEp1) {
  if (comm::mpi_world()->size() != 8) GTEST_SKIP() << "the EP x TP x PP grid needs 8 ranks";
  const std::vector<std::string> grid = {"parallelism.tensor_parallel=2", "parallelism.pipeline_parallel=2"};
  test_support::Outcome straight;
  expect_reproduces_single_process("mixtral_3d", kMixtral, 2, 3, "fp64", grid, &straight);
  if (comm::mpi_world()->rank() == 0) {
    // The plan (plan.json, what the trainer checked) holds stage 0's model states as its rank 0
    // measured them (memory.json: both engines' halves of the stage's units; the plan prices fp32,
    // this run holds 8-byte elements and moments), and its verdict is the larger stage's.
    const auto dir = config(kMixtral, 2, 3, 2, "fp64", "mixtral_3d_ep2_zero3_fp64", 8, false, grid).out_dir;
    nlohmann::json memory, plan;
    std::ifstream(dir + "/memory.json") >> memory;
    std::ifstream(dir + "/plan.json") >> plan;
    const auto& stages = plan.at("pipeline_stages");
    const auto& verdict = plan.at("stages").at(0);
    const auto& peak = stages.at(verdict.at("peak_pipeline_stage").get<size_t>()).at("memory").at(0);
    for (const char* key : {"compute_params", "gradients", "master_params", "optimizer_states"}) {
      EXPECT_EQ(memory.at(key).get<int64_t>(), 2 * stages.at(0).at("memory").at(0).at(key).get<int64_t>()) << key;
      EXPECT_EQ(verdict.at(key).get<int64_t>(), peak.at(key).get<int64_t>()) << key;
    }
  }
  expect_reshard_continues(kMixtral, 2, 3, 1, 3, grid, &straight);
}

// Hybrid sharding (4 ranks: dp 4 in shards of 2, ep 2): the dense engine shards over each shard
// group and all-reduces across the two replicas; the experts' engine over the edp ranks of its
// replica (one) and across replicas (parallel_dims.h eshard_comm / ereplica_comm).
TEST(ExpertParallel, Ep2WithHybridZero3ReproducesOneProcess) {
  if (comm::mpi_world()->size() != 4) GTEST_SKIP() << "shards of 2 in 2 replicas need 4 ranks";
  expect_reproduces_single_process("mixtral_hybrid2", kMixtralAux, 2, 3, "fp64",
                                   {"parallelism.hybrid_shard=true", "parallelism.shard_group_size=2"});
}

// Checkpoints reshard across ep (and ZeRO stages).
TEST(ExpertParallel, CheckpointOfEp2ResumesOnEp1) { expect_reshard_continues(kMixtralAux, 2, 0, 1, 0); }
TEST(ExpertParallel, CheckpointOfEp1Zero1ResumesOnEp2Zero3) { expect_reshard_continues(kQwen2Moe, 1, 1, 2, 3); }

// The planner (plan --ep, plan/experts.cpp) predicts what a run measures: memory.json's model states
// (the two engines' formula) and the bytes of the token all_to_alls and of the expert gradients'
// edp collectives in metrics.jsonl.
TEST(ExpertParallel, PlanPredictsModelStatesAndTraffic) {
  auto world = comm::mpi_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  for (int stage : {1, 3}) {
    const auto cfg = config(kMixtralAux, 2, stage, 2, "fp32", "plan_zero" + std::to_string(stage));
    const auto got = train_ep(cfg, world);
    // A rank sends its own rows and returns the rows its experts received: the plan counts a
    // balanced router, which the mean over the ranks is (every row is received once).
    auto sent = at::tensor({got.history.back().extra.at("comm_ep_all_to_all_bytes")}, at::kDouble);
    world->all_reduce(sent);
    const double mean_sent = sent.item<double>() / world->size();
    if (world->rank() != 0) continue;
    nlohmann::json memory;
    std::ifstream(cfg.out_dir + "/memory.json") >> memory;
    plan::PlanRequest r;
    r.model = cfg.model;
    r.devices = world->size();
    r.zero_stage = stage;
    r.precision = "fp32";
    r.ep = 2;
    r.accumulation = cfg.grad_accum;
    r.micro_batch = cfg.micro_batch;
    r.seq_len = cfg.data.seq_len;
    r.persistence_threshold = cfg.zero.stage3_param_persistence_threshold;
    const auto p = plan::make_plan(r);
    const auto& sp = p.stages.front();
    for (const char* key : {"compute_params", "gradients", "master_params", "optimizer_states"})
      EXPECT_EQ(memory.at(key).get<int64_t>(), key == std::string("compute_params") ? sp.memory.compute_params
                                                : key == std::string("gradients")    ? sp.memory.gradients
                                                : key == std::string("master_params") ? sp.memory.master_params
                                                                                     : sp.memory.optimizer_states)
          << key << " at stage " << stage;
    const auto& m = got.history.back().extra;
    EXPECT_EQ(mean_sent, sp.comm_bytes.at("ep_all_to_all")) << "stage " << stage;
    if (world->size() > 2) {  // edp of more than one rank
      EXPECT_EQ(m.at("comm_edp_reduce_scatter_bytes"), sp.comm_bytes.at("edp_reduce_scatter")) << "stage " << stage;
    }
    std::printf("[ expert-parallel ] plan vs run, ZeRO %d, ep=2 of %d: all_to_all %.0f bytes per step and rank (planned %.0f), "
                "model states %lld bytes (planned %lld)\n",
                stage, world->size(), mean_sent, sp.comm_bytes.at("ep_all_to_all"),
                static_cast<long long>(memory.at("total_model_states").get<int64_t>()),
                static_cast<long long>(sp.memory.model_states()));
  }
}

// Bad input stops before training, naming the key and the fix.
TEST(ExpertParallel, RefusesDenseModelsAndExpertCountsItDoesNotDivide) {
  auto world = comm::mpi_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const auto dense = error_of([&] { train::Trainer(config({}, 2, 0, 1, "fp32", "ep_dense"), world, true); });
  EXPECT_NE(dense.find("parallelism.expert_parallel = 2 but model_type llama is a dense model"), std::string::npos)
      << dense;
  auto three = kMixtralAux;
  three[1] = "model.num_local_experts=3";
  const auto uneven = error_of([&] { train::Trainer(config(three, 2, 0, 1, "fp32", "ep_uneven"), world, true); });
  EXPECT_NE(uneven.find("parallelism.expert_parallel = 2 does not divide the model's 3 experts"), std::string::npos)
      << uneven;
}
