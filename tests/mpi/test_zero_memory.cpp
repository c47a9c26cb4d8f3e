// ZeRO's memory per rank is the planner's, exactly: memory.json's model states equal the ZeRO formula
// and plan::model_state_bytes at every stage (N ranks and one), stage 3's gathered peak is the
// planner's replay of the gather/release rules; and hybrid sharding reproduces ZeRO over all ranks,
// with the planned model states and fewer bytes between shard groups.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/stage3_schedule.h"
#include "parallel/zero/zero_policies.h"
#include "plan/planner.h"
#include "train/trainer.h"
#include "zero_runs.h"

using namespace shardlm;
using namespace shardlm::zero_test;

TEST(Zero, MemoryPerRankIsTheZeroFormula) {
  const int n = comm::mpi_world()->size();
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      auto cfg = config(stage, precision, "mem", 1);
      train::Trainer trainer(cfg, comm::mpi_world(), true);
      // The padded parameter count Ψ' (each unit rounded up to a multiple of N) from the layout.
      const auto layout = parallel::FlatLayout::build(trainer.model(), n);
      const double psi = stage == 0 ? layout.numel() : layout.padded_numel();
      trainer.run();
      comm::mpi_world()->barrier();  // rank 0 writes memory.json
      nlohmann::json m;
      std::ifstream(cfg.out_dir + "/memory.json") >> m;
      const double c = precision == "bf16" ? 2 : 4;  // compute dtype bytes
      // Gradient shards accumulate in fp32 (data_types.grad_accum_dtype default); master weights
      // are separate only when computing in bf16 (in fp32 the shard is the master).
      const double master = precision == "bf16" ? 4 : 0;
      double params = c * psi, grads = c * psi;
      if (stage >= 2) grads = 4 * psi / n;
      if (stage == 3) params = c * psi / n;
      const double sharded_over = stage > 0 ? n : 1;
      const double expect_total = params + grads + master * psi / sharded_over + 8 * psi / sharded_over;
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + precision + " N=" + std::to_string(n));
      EXPECT_EQ(m["compute_params"].get<double>(), params);
      // The planner predicts the same bytes from the same layout, exactly.
      const auto planned = plan::model_state_bytes(cfg.model, stage, n, precision, cfg.grad_accum_dtype,
                                                   cfg.zero.stage3_param_persistence_threshold);
      EXPECT_EQ(planned.compute_params, m["compute_params"].get<int64_t>());
      EXPECT_EQ(planned.gradients, m["gradients"].get<int64_t>());
      EXPECT_EQ(planned.master_params, m["master_params"].get<int64_t>());
      EXPECT_EQ(planned.optimizer_states, m["optimizer_states"].get<int64_t>());
      EXPECT_EQ(m["gradients"].get<double>(), grads);
      EXPECT_EQ(m["total_model_states"].get<double>(), expect_total);
      if (precision == "bf16") {
        // With bf16 gradients the sums are the ZeRO paper's: 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N.
        const double paper[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
        EXPECT_EQ(expect_total - (stage >= 2 ? 2 * psi / n : 0), paper[stage]);
      }
      if (stage == 3) {
        // A unit, and the prefetch window, which may overshoot by a unit (stage3_schedule.h).
        const double bound = c * (2 * layout.largest_unit_numel() + cfg.zero.stage3_prefetch_bucket_size);
        EXPECT_GT(m["gathered_peak"].get<double>(), 0);
        EXPECT_LE(m["gathered_peak"].get<double>(), bound);
        // The planner predicts the engine's largest gathered set from the same layout, exactly.
        EXPECT_EQ(parallel::stage3_gathered_peak_numel(layout, cfg.zero.stage3_prefetch_bucket_size,
                                                   cfg.zero.stage3_param_persistence_threshold) * c,
                  m["gathered_peak"].get<double>());
      }
    }
  }
}

// Stage 3's largest gathered set, as the engine measures it, is what the planner's replay of the
// engine's gather/release rules (stage3_schedule.h) predicts: six layers larger than the embedding
// (intermediate 2048: 405632 elements), with tied embeddings (the embedding stays gathered from the
// head's backward to its own, under every layer's backward) and without, prefetch windows of none,
// half a layer (which still prefetches one), one, two layers and the whole model. The window counts
// the units it already gathered, so no more than the largest unit, the window (which may overshoot by
// a unit) and (tied) the embedding are ever gathered at once; a window that skipped them would
// gather two more layers at every layer and hold five of the six.
TEST(Zero, Stage3GatheredPeakIsThePlannedReplay) {
  const int n = comm::mpi_world()->size();
  const int64_t layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 2048 + 2 * 64;
  for (const bool tied : {true, false}) {
    for (const double prefetch : {0.0, 200'000.0, 1.0 * layer, 2.0 * layer, 5e6}) {
      auto cfg = config(3, "bf16", "gathered", 1);
      cfg.model.tie_word_embeddings = tied;
      cfg.model.num_hidden_layers = 6;
      cfg.model.intermediate_size = 2048;
      cfg.zero.stage3_prefetch_bucket_size = prefetch;
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + " prefetch " + std::to_string(prefetch));
      train::Trainer trainer(cfg, comm::mpi_world(), true);
      const auto layout = parallel::FlatLayout::build(trainer.model(), n);
      trainer.run();
      const int64_t planned = parallel::stage3_gathered_peak_numel(layout, prefetch, 0);
      EXPECT_EQ(2 * planned, trainer.memory().gathered_peak);  // every rank's own
      const int64_t embedding = layout.units[0].padded_numel;
      EXPECT_LE(planned, 2 * layout.largest_unit_numel() + prefetch + (tied ? embedding : 0));
      auto padded = [n](int64_t e) { return (e + n - 1) / n * n; };
      // By hand: with no prefetch, a layer's backward runs with the embedding (4096 x 64) still
      // gathered since the head's backward; with a window of half a layer, a layer and the next;
      // with a window of two layers, a layer and the two above.
      if (tied && prefetch == 0) {
        EXPECT_EQ(planned, padded(4096 * 64) + padded(layer));
      }
      if (!tied && prefetch == 200'000) {
        EXPECT_EQ(planned, 2 * padded(layer));
      }
      if (!tied && prefetch == 2.0 * layer && n == 2) {
        EXPECT_EQ(planned, 3 * layer);
      }
    }
  }
}

// N = 1: every rank plans and trains alone on its own one-rank communicator.
TEST(Zero, PlannerMatchesMemoryOnOneRank) {
  auto world = comm::mpi_world();
  auto self = world->split(world->rank(), 0, "self");
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      auto cfg = config(stage, precision, "mem1_" + std::to_string(world->rank()), 1);
      train::Trainer trainer(cfg, self, true);
      trainer.run();
      nlohmann::json m;
      std::ifstream(cfg.out_dir + "/memory.json") >> m;
      const auto planned = plan::model_state_bytes(cfg.model, stage, 1, precision, cfg.grad_accum_dtype,
                                                   cfg.zero.stage3_param_persistence_threshold);
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + precision + " N=1");
      EXPECT_EQ(planned.model_states(), m["total_model_states"].get<int64_t>());
      EXPECT_EQ(planned.gradients, m["gradients"].get<int64_t>());
    }
  }
}

namespace {

// Hybrid sharding (parallel_dims.h): ZeRO over shard groups of `shard` ranks, gradients all-reduced
// across the groups. On 4 ranks groups of 2 (2 replicas), on 2 ranks groups of 1.
train::TrainConfig hybrid(train::TrainConfig c, int shard) {
  c.parallelism.hybrid_shard = true;
  c.parallelism.shard_group_size = shard;
  c.out_dir += "_hybrid" + std::to_string(shard);
  return c;
}

int hybrid_shard_size() { return comm::mpi_world()->size() / 2; }  // two replicas

void check_hybrid(int stage, const std::string& precision) {
  const int n = comm::mpi_world()->size();
  if (n % 2 != 0) GTEST_SKIP() << "two replicas need an even world";
  // Like with like: the same stage sharded over all n ranks. Only the summation order differs (a
  // reduce-scatter over n/2 ranks, then a sum of two), so fp64 equals to rounding and fp32 to its.
  const Tolerance tol = precision == "fp64" ? Tolerance{1e-12, 1e-12, 1e-12} : Tolerance{1e-7, 5e-5, 5e-6};
  const std::string tag = "hyb" + std::to_string(stage) + "_" + precision;
  const auto ref = run_training(config(stage, precision, tag, 10, 1e-3));
  const auto got = run_training(hybrid(config(stage, precision, tag, 10, 1e-3), hybrid_shard_size()));
  if (comm::mpi_world()->rank() == 0)
    expect_same(got, ref, tol, "hybrid stage " + std::to_string(stage) + " shards of " +
                                   std::to_string(hybrid_shard_size()) + " " + precision + " vs ZeRO over " +
                                   std::to_string(n));
}

}  // namespace

TEST(HybridShard, Zero3ReproducesZero3Fp64) { check_hybrid(3, "fp64"); }
TEST(HybridShard, Zero3ReproducesZero3Fp32) { check_hybrid(3, "fp32"); }
TEST(HybridShard, Zero2ReproducesZero2Fp64) { check_hybrid(2, "fp64"); }
TEST(HybridShard, Zero1ReproducesZero1Fp64) { check_hybrid(1, "fp64"); }

// Model states are ZeRO's over the shard group (memory.json equals the planner's, exactly), and the
// bytes that cross between shard groups per step — hybrid: the replica all-reduce of each rank's
// gradient shard; ZeRO over all ranks: every reduce-scatter and all-gather, whose group spans them —
// equal the plan and are fewer.
TEST(HybridShard, MemoryAndCrossGroupBytesAreThePlans) {
  const int n = comm::mpi_world()->size();
  if (n % 2 != 0) GTEST_SKIP() << "two replicas need an even world";
  const int g = hybrid_shard_size();
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int stage = 1; stage <= 3; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + precision + " N=" + std::to_string(n));
      const auto cfg = hybrid(config(stage, precision, "hybmem", 2), g);
      const auto got = run_training(cfg);
      const auto flat = run_training(config(stage, precision, "hybmem_flat", 2));
      if (comm::mpi_world()->rank() != 0) continue;
      const auto planned = plan::model_state_bytes(cfg.model, stage, g, precision, cfg.grad_accum_dtype,
                                                   cfg.zero.stage3_param_persistence_threshold);
      EXPECT_EQ(planned.compute_params, got.memory["compute_params"].get<int64_t>());
      EXPECT_EQ(planned.gradients, got.memory["gradients"].get<int64_t>());
      EXPECT_EQ(planned.master_params, got.memory["master_params"].get<int64_t>());
      EXPECT_EQ(planned.optimizer_states, got.memory["optimizer_states"].get<int64_t>());
      plan::PlanRequest r;
      r.model = cfg.model;
      r.devices = n;
      r.zero_stage = stage;
      r.precision = precision;
      r.shard = g;
      r.accumulation = cfg.grad_accum;
      r.micro_batch = cfg.micro_batch;
      r.seq_len = cfg.data.seq_len;
      const auto p = plan::make_plan(r);
      const double across = got.history.back().extra.at("comm_replica_all_reduce_bytes");
      EXPECT_EQ(across, p.stages.front().comm_bytes.at("replica_all_reduce"));
      double flat_bytes = 0;  // ZeRO over all n ranks: its collectives span the groups
      for (const auto& [k, v] : flat.history.back().extra)
        if (k.rfind("comm_", 0) == 0 && k.size() > 6 && k.compare(k.size() - 6, 6, "_bytes") == 0) flat_bytes += v;
      EXPECT_LT(across, flat_bytes);
      std::printf("[ hybrid   ] stage %d %s N=%d shards of %d: bytes between groups %.0f per step (planned %.0f), "
                  "ZeRO over all ranks %.0f\n", stage, precision.c_str(), n, g, across,
                  p.stages.front().comm_bytes.at("replica_all_reduce"), flat_bytes);
    }
  }
}

// A stage is a choice of policies (parallel/zero/zero_policies.h): the reduction shared by stages 1
// and 2 differs only in which micro-step reduces, stage 0 offloads nothing, parameters leave the
// device only at stage 3; and the planner's model states are policy_memory of that same choice, the
// engine's sum, for every stage and offload (checked on one process: no collective runs).
TEST(ZeroPolicies, AStageIsAChoiceOfPoliciesAndThePlanIsTheirSum) {
  using parallel::GradReduction;
  using parallel::ParamResidency;
  using parallel::StatePlacement;
  const parallel::OffloadChoice none;
  EXPECT_EQ(parallel::zero_policies(0, none).grads, GradReduction::AllReduceAtBoundary);
  EXPECT_EQ(parallel::zero_policies(1, none).grads, GradReduction::ReduceScatterLastMicroStep);
  EXPECT_EQ(parallel::zero_policies(2, none).grads, GradReduction::ReduceScatterEveryMicroStep);
  EXPECT_EQ(parallel::zero_policies(3, none).grads, GradReduction::ReduceScatterEveryMicroStep);
  EXPECT_EQ(parallel::zero_policies(2, none).params, ParamResidency::Replicated);
  EXPECT_EQ(parallel::zero_policies(3, none).params, ParamResidency::Sharded);
  parallel::OffloadChoice everything;
  everything.states_cpu = everything.states_nvme = everything.host_apart = true;
  everything.params_nvme = everything.params_apart = true;
  EXPECT_EQ(parallel::zero_policies(0, everything).states, StatePlacement::Device);
  EXPECT_FALSE(parallel::zero_policies(2, everything).params_nvme);
  EXPECT_TRUE(parallel::zero_policies(3, everything).params_nvme);
  EXPECT_EQ(parallel::zero_policies(1, everything).states, StatePlacement::Nvme);
  const auto model = config(3, "bf16", "policies", 1).model;
  const int n = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const bool host : {false, true}) {
      for (const bool disk : {false, true}) {
        for (const bool nvme_params : {false, true}) {
          SCOPED_TRACE("stage " + std::to_string(stage) + (host ? " host" : "") + (disk ? " disk" : "") +
                       (nvme_params ? " nvme parameters" : ""));
          const plan::ParamOffloadPlan params{/*host=*/false, nvme_params, /*max_in_cpu=*/1e5};
          const auto planned = plan::model_state_bytes(model, stage, n, "bf16", "fp32", 0, 1, "fp32", 4096, host,
                                                       optim::MasterRounding::None, disk, params);
          const auto layout = parallel::FlatLayout::build(model::describe(model), stage == 0 ? 1 : n);
          const auto policies = parallel::zero_policies(stage, {host, host && disk, true, nvme_params, false});
          const auto sum = parallel::policy_memory(layout, policies, {2, 4, 4}, 0, 1e5);
          EXPECT_EQ(planned.compute_params, sum.compute_params);
          EXPECT_EQ(planned.gradients, sum.gradients);
          EXPECT_EQ(planned.master_params, sum.master_params);
          EXPECT_EQ(planned.optimizer_states, sum.optimizer_states);
          EXPECT_EQ(planned.host, sum.host);
          EXPECT_EQ(planned.offloaded, sum.offloaded);
        }
      }
    }
  }
}
