// The fault-injection seam (parallel/fault_injection.h) on one process, with a stand-in strategy and
// communicator: without faults the strategy comes back undecorated (a normal run has no fault code
// in its path); with faults it is wrapped, a perturbation lands only at its step and rank (counted
// across a resume), a delayed rank's all-gathers reach the real communicator late, a desynced rank
// skips the collective it was told to (and SHARDLM_TEST_DESYNC is read or refused). The faults'
// effects on real runs (overflow, attenuation, delayed ZeRO-3 gathers, perturbed replicas) are the
// MPI tests' (test_zero, test_tensor_parallel, test_pipeline_parallel, test_checkpoint, test_consistency).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "model/llama.h"
#include "model/llama_config.h"
#include "comm/flight_recorder.h"
#include "parallel/fault_injection.h"
#include "util/error.h"

using namespace shardlm;

namespace {

// One rank; all_gather_async counts its calls and completes nothing (never waited on here).
class CountingComm : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  comm::WorkPtr all_reduce_async(const at::Tensor&, comm::ReduceOp) override { return nullptr; }
  comm::WorkPtr reduce_scatter_async(const at::Tensor&, const at::Tensor&, comm::ReduceOp) override { return nullptr; }
  comm::WorkPtr all_gather_async(const at::Tensor&, const at::Tensor&) override {
    ++gathers;
    return nullptr;
  }
  comm::WorkPtr broadcast_async(const at::Tensor&, int) override { return nullptr; }
  comm::WorkPtr send_async(const at::Tensor&, int, int) override { return nullptr; }
  comm::WorkPtr recv_async(const at::Tensor&, int, int) override { return nullptr; }
  comm::WorkPtr barrier_async() override { return nullptr; }
  std::shared_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }
  int gathers = 0;

 private:
  std::string name_ = "counting";
};

// Holds one replicated fp32 tensor "w" and the communicator it was built over.
class StandIn : public parallel::Strategy {
 public:
  explicit StandIn(comm::CommPtr dp) : dp(std::move(dp)) {}
  std::string describe() const override { return "stand-in"; }
  std::vector<parallel::pp::StageUnits> stage_units() const override { return {{0, 0}}; }
  model::UnitHooks* forward_hooks() override { return nullptr; }
  void begin_micro_step(bool) override {}
  void finish_gradients(double) override {}
  double grad_norm() override { return 0; }
  void step(double, double, double) override {}
  std::vector<parallel::UnitGradStats> unit_grad_stats() override { return {}; }
  void skip_step() override {}
  void set_unit_loss_scales(std::vector<double>) override {}
  std::vector<std::string> unit_names() const override { return {}; }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override { return {}; }
  parallel::ModelStateMemory memory() const override { return {}; }
  parallel::CheckpointView checkpoint_view() override { return {nullptr, {}, true, [](int64_t, int64_t) {}}; }
  std::vector<parallel::ReplicaSet> replicated_tensors(bool) override { return {{"data-parallel", dp, {{"w", w}}}}; }
  comm::CommPtr dp;
  at::Tensor w = at::ones({3});
};

struct Seam {
  model::Llama model{model::preset("tiny"), 0};
  std::shared_ptr<CountingComm> comm = std::make_shared<CountingComm>();
  parallel::ParallelDims dims;
  StandIn* built = nullptr;
  Seam() { dims.world = dims.dp_comm = comm; }
  std::unique_ptr<parallel::Strategy> build() {
    return parallel::with_injected_faults(model, dims, [this](const parallel::ParallelDims& d) {
      auto s = std::make_unique<StandIn>(d.dp_comm);
      built = s.get();
      return s;
    });
  }
};

}  // namespace

TEST(FaultInjection, WithoutFaultsTheStrategyComesBackUndecorated) {
  Seam seam;
  const auto strategy = seam.build();
  EXPECT_EQ(strategy.get(), seam.built);
  EXPECT_EQ(seam.built->dp, seam.comm);
}

TEST(FaultInjection, APerturbationLandsAtItsStepOnlyAndCountsAcrossAResume) {
  parallel::FaultInjection f;
  f.perturb_rank = 0;
  f.perturb_step = 6;  // 0-based: the 7th step's gradients
  f.perturb_gradient = true;
  f.perturb_tensor = "w";
  const parallel::FaultScope scope(f);
  Seam seam;
  const auto strategy = seam.build();
  ASSERT_NE(strategy.get(), seam.built);
  EXPECT_EQ(strategy->describe(), "stand-in");
  strategy->checkpoint_view().loaded(5, 5);  // resumed after 5 steps
  strategy->replicated_tensors(true);        // step 6's gradients: untouched
  EXPECT_TRUE(at::equal(seam.built->w, at::ones({3})));
  strategy->skip_step();
  strategy->replicated_tensors(false);  // step 6's parameters: untouched
  EXPECT_TRUE(at::equal(seam.built->w, at::ones({3})));
  strategy->replicated_tensors(true);  // step 7's gradients: one ulp up on the first element
  EXPECT_EQ(seam.built->w[0].item<float>(), std::nextafter(1.0f, 2.0f));
  EXPECT_EQ(seam.built->w[1].item<float>(), 1.0f);
}

TEST(FaultInjection, ADelayedRanksGathersReachTheCommunicatorLate) {
  parallel::FaultInjection f;
  f.delay_gather_rank = 0;
  f.delay_gather_ms = 20;
  const parallel::FaultScope scope(f);
  Seam seam;
  const auto strategy = seam.build();
  ASSERT_NE(seam.built->dp, seam.comm);  // the strategy talks through the delaying decorator
  const auto t0 = std::chrono::steady_clock::now();
  seam.built->dp->all_gather_async(at::ones({1}), at::ones({1}));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(20));
  EXPECT_EQ(seam.comm->gathers, 1);
  seam.built->dp->all_reduce_async(at::ones({1}), comm::ReduceOp::Sum);  // other calls pass straight through
  EXPECT_EQ(seam.comm->gathers, 1);
}

TEST(FaultInjection, ADesyncedRankSkipsTheChosenCollectiveOnly) {
  parallel::FaultInjection f;
  f.desync_rank = 0;
  f.desync_kind = "skip";
  f.desync_phase = "gather layers.1";
  f.desync_occurrence = 2;
  const parallel::FaultScope scope(f);
  Seam seam;
  seam.dims.shard_comm = seam.comm;  // no hybrid sharding: the ZeRO engine's group is dp_comm
  comm::CommPtr shard;
  const auto strategy = parallel::with_injected_faults(seam.model, seam.dims, [&](const parallel::ParallelDims& d) {
    shard = d.shard_comm;
    auto s = std::make_unique<StandIn>(d.dp_comm);
    seam.built = s.get();
    return s;
  });
  auto* dp = seam.built->dp.get();
  ASSERT_NE(dp, seam.comm.get());
  EXPECT_EQ(shard.get(), dp);  // the engine's group is the decorated one too
  const auto gather = [&](const std::string& phase) {
    const comm::FlightContext label(phase);
    return dp->all_gather_async(at::ones({2}), at::ones({2}));
  };
  gather("train / gather layers.0");  // another phase: passes
  gather("train / gather layers.1");  // the first occurrence: passes
  EXPECT_EQ(seam.comm->gathers, 2);
  const auto skipped = gather("train / gather layers.1");  // the second: left out
  ASSERT_TRUE(skipped);
  EXPECT_TRUE(skipped->test());
  EXPECT_EQ(seam.comm->gathers, 2);
  // (The rank's next collective would hold it until its peers time out: an end-to-end matter,
  // tests/integration/test_timeout.py.)
}

TEST(FaultInjection, TheDesyncEnvironmentVariableIsReadOrRefused) {
  parallel::FaultInjection f;
  setenv("SHARDLM_TEST_DESYNC", "rank=1,kind=size,phase=train / backward micro 0 / reduce-scatter layers.0,occurrence=2", 1);
  parallel::desync_from_environment(f);
  EXPECT_EQ(f.desync_rank, 1);
  EXPECT_EQ(f.desync_kind, "size");
  EXPECT_EQ(f.desync_phase, "train / backward micro 0 / reduce-scatter layers.0");
  EXPECT_EQ(f.desync_occurrence, 2);
  EXPECT_TRUE(f.any());
  for (const char* bad : {"rank=1,kind=drop", "rank=x,kind=skip", "kind=skip", "rank=0,kind=skip,when=3", "rank=0 kind=skip"}) {
    setenv("SHARDLM_TEST_DESYNC", bad, 1);
    parallel::FaultInjection g;
    EXPECT_THROW(parallel::desync_from_environment(g), Error) << bad;
  }
  unsetenv("SHARDLM_TEST_DESYNC");
  parallel::FaultInjection none;
  parallel::desync_from_environment(none);
  EXPECT_FALSE(none.any());
}
