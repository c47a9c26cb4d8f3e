// Parameter offload (zero_optimization.offload_param, ZeRO stage 3) with pipeline and expert
// parallelism: each pipeline stage's ZeRO engine offloads its own units' shards, and expert
// parallelism's two engines each theirs (the experts' files under their own name, beside the dense
// engine's in one nvme_path). On 2 ranks (pp 2; ep 2), NVMe with the shards in place as a CPU run keeps
// them and in the GPU layout (host shards apart from the device, SHARDLM_TEST_OFFLOAD_APART), against the
// same run without offload: losses and grad norms bit for bit, and every rank's model-state bytes equal
// to the planner's for that rank (its pipeline stage's; the two engines' halves), with the shards'
// bytes on `offloaded`. (Breaking it fails it: without the experts' own file names both engines' files
// collide and the losses change; the planner's per-engine pricing is what `host` and `offloaded` match.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "comm/mpi_communicator.h"
#include "plan/planner.h"
#include "test_dirs.h"
#include "train/plan_check.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

struct Run {
  std::vector<observe::StepMetrics> history;
  parallel::ModelStateMemory memory;
  plan::MemoryBreakdown planned;  // the planner's for this rank
};

Run train_with(const std::vector<std::string>& layout, const std::string& tag, const std::vector<std::string>& extra,
               bool apart, comm::CommPtr world) {
  std::vector<std::string> overrides = {
      "steps=2", "data.val=", "threads=1", "comm.timeout_s=30", "resume=false", "checkpoint_interval=0",
      "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=2", "model.num_hidden_layers=2",
      "zero_optimization.stage=3", "zero_optimization.stage3_param_persistence_threshold=0",
      "zero_optimization.stage3_prefetch_bucket_size=200000"};
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto cfg = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  cfg.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  cfg.out_dir = test_support::mpi_test_path("param_offload_" + tag);
  if (apart) ::setenv("SHARDLM_TEST_OFFLOAD_APART", "1", 1);
  Run run;
  {
    train::Trainer trainer(cfg, world, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
    run.history = trainer.run().history;
    run.memory = trainer.memory();
  }
  // This rank's engines against the planner's numbers for this rank (asked while the layout's variable is
  // set, as the trainer's plan.json is): a pipeline stage is world rank r (dp 1); with ep 2 every rank
  // holds the same shapes.
  const auto p = plan::make_plan(train::plan_request(cfg, world->size(), 3, cfg.micro_batch));
  run.planned = p.pipeline_stages.empty()
                    ? p.stages.front().memory
                    : p.pipeline_stages.at(static_cast<size_t>(world->rank())).memory.front();
  ::unsetenv("SHARDLM_TEST_OFFLOAD_APART");
  return run;
}

void expect_offload_changes_nothing_and_is_planned(const std::string& name, const std::vector<std::string>& layout) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "one layout of 2 ranks (pp 2 or ep 2) is enough";
  const auto ref = train_with(layout, name + "_ref", {}, false, world);
  for (bool apart : {false, true}) {
    const std::string dir = test_support::mpi_test_path("param_offload_" + name + (apart ? "_apart_nvme" : "_nvme"));
    std::filesystem::create_directories(dir);
    world->barrier();
    const std::vector<std::string> nvme = {"zero_optimization.offload_param.device=nvme",
                                           "zero_optimization.offload_param.nvme_path=" + dir,
                                           "zero_optimization.offload_param.max_in_cpu=0",
                                           "zero_optimization.offload_param.buffer_count=2"};
    const auto got = train_with(layout, name + (apart ? "_apart" : "_off"), nvme, apart, world);
    const std::string what = name + (apart ? " (GPU layout)" : "") + " rank " + std::to_string(world->rank());
    ASSERT_EQ(got.history.size(), ref.history.size()) << what;
    for (size_t i = 0; i < ref.history.size(); ++i) {
      EXPECT_EQ(got.history[i].loss, ref.history[i].loss) << what << " step " << i + 1;
      EXPECT_EQ(got.history[i].grad_norm, ref.history[i].grad_norm) << what << " step " << i + 1;
    }
    const auto& m = got.memory;
    const auto& planned = got.planned;
    EXPECT_EQ(m.compute_params, planned.compute_params) << what;
    EXPECT_EQ(m.gradients, planned.gradients) << what;
    EXPECT_EQ(m.master_params, planned.master_params) << what;
    EXPECT_EQ(m.optimizer_states, planned.optimizer_states) << what;
    EXPECT_EQ(m.host, planned.host) << what;
    EXPECT_EQ(m.offloaded, planned.offloaded) << what;
    // Every sharded unit's shard is in a file: none left among the compute parameters, nothing in host
    // memory (no optimizer offload: nothing else is there; apart, the shards' memory is the files').
    EXPECT_GT(m.offloaded, 0) << what;
    EXPECT_EQ(m.compute_params, 0) << what;
    EXPECT_EQ(m.host, 0) << what;
    world->barrier();
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << what << ": the parameter files outlive the run";
  }
}

}  // namespace

TEST(ParamOffloadLayouts, PipelineStagesOffloadTheirOwnUnits) {
  expect_offload_changes_nothing_and_is_planned("pp2", {"parallelism.pipeline_parallel=2"});
}

TEST(ParamOffloadLayouts, ExpertEnginesOffloadUnderTheirOwnNames) {
  expect_offload_changes_nothing_and_is_planned(
      "ep2", {"model.model_type=mixtral", "model.num_local_experts=4", "model.num_experts_per_tok=2",
              "model.intermediate_size=64", "parallelism.expert_parallel=2"});
}
