// The fault-injection seam (parallel/fault_injection.h) on one process, with a stand-in strategy and
// communicator: without faults the strategy comes back undecorated (a normal run has no fault code
// in its path); with faults it is wrapped, a perturbation lands only at its step and rank (counted
// across a resume), and a delayed rank's all-gathers reach the real communicator late. The faults'
// effects on real runs (overflow, attenuation, delayed ZeRO-3 gathers, perturbed replicas) are the
// MPI tests' (test_zero, test_model_parallel, test_checkpoint, test_consistency).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "model/llama.h"
#include "model/llama_config.h"
#include "parallel/fault_injection.h"

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
  parallel::pp::StageUnits stage_units() const override { return {0, 0}; }
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
