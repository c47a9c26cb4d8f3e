// bf16 master weights under ZeRO (optimizer.master_precision "bf16", optim/master_format.h): the update
// of an element depends only on that element (Kahan's compensation is per element; stochastic rounding
// draws its bits from (seed, step, parameter, element index in the whole parameter)), so ZeRO-1 and
// ZeRO-3 on 2 ranks train exactly as one rank on the same windows, and a checkpoint written on 2 ranks
// (bf16 masters, Kahan compensation by element range) resumes on 1 bit for bit. memory.json equals the
// planner's bytes: no fp32 masters, and Kahan's 2 bytes per parameter among the optimizer states.
// With optimizer offload (cpu and nvme; in place, and in a GPU run's layout with the host buffers apart)
// the bf16 master and Kahan's compensation live in host memory or the files instead, and with NVMe
// parameter offload the bf16 shards (the masters) in files; the run is the same run bit for bit, resumes
// from its checkpoint bit for bit, and memory.json equals plan.json.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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

// extra: more overrides (offload).
train::TrainConfig config(const MasterRun& r, int64_t steps, const std::string& dir, bool resume,
                          const std::vector<std::string>& extra = {}) {
  // Gradients of the two windows: summed in bf16 by the reduce-scatter on 2 ranks, by autograd's
  // accumulation on 1 (one rounding each); grad_accum_dtype bf16 keeps stage 3's shard in that dtype too.
  std::vector<std::string> overrides{
       "steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=60", "gradient_clipping=0",
       std::string("resume=") + (resume ? "true" : "false"), "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=" + std::to_string(std::max(1, 2 / r.ranks)), "optimizer.params.lr=3e-3",
       "zero_optimization.stage=" + std::to_string(r.stage), "zero_optimization.stage3_param_persistence_threshold=0",
       "model.num_hidden_layers=2", "bf16.enabled=true", "data_types.grad_accum_dtype=\"bf16\"",
       "optimizer.master_precision=\"bf16\"", "optimizer.master_rounding=\"" + r.rounding + "\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = dir;
  return c;
}

using test_support::expect_identical_runs;
using Outcome = test_support::RunOutcome;

// Trains on the first r.ranks world ranks (the others wait).
Outcome train_on(const MasterRun& r, int64_t steps, const std::string& dir, bool resume,
                 const std::vector<std::string>& extra = {}) {
  return test_support::train_on_first_ranks(r.ranks, config(r, steps, dir, resume, extra), dir, "bf16_masters_test");
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

// bf16 masters with offload, ZeRO-3 on 2 ranks, Kahan: the host optimizer (offload_optimizer cpu) in
// place and in the GPU layout (SHARDLM_TEST_OFFLOAD_APART: bf16 host masters apart from the device's
// shard, gradients copied down, masters up), NVMe parameter shards (the bf16 shards, the masters, in
// files), alone and with NVMe states (moments and compensation in the files), each the same run as
// without offload bit for bit: losses and final weights; NVMe states in the GPU layout (the bf16 master
// in the files too), stopped after 2 steps and resumed from its checkpoint (the compensation read back
// into the files), too. Each run's memory.json equals its plan.json: the bf16 master (2 bytes) and
// compensation (2) on `host` or `offloaded`, no fp32 master and no cast buffer anywhere.
TEST(Bf16Masters, OffloadIsBitIdenticalResumesAndIsAsPlanned) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks";
  const MasterRun r{2, 3, "kahan"};
  const std::string base = test_support::mpi_test_path(r.name() + "_offload");
  const std::string nvme = base + "_files", nvme_params = base + "_param_files";
  if (world->rank() == 0)
    for (const auto& dir : {nvme, nvme_params}) std::filesystem::create_directories(dir);
  world->barrier();
  const std::string chunks = "zero_optimization.sub_group_size=20000";
  const std::vector<std::string> cpu{"zero_optimization.offload_optimizer.device=\"cpu\"", chunks};
  const std::vector<std::string> states{"zero_optimization.offload_optimizer.device=\"nvme\"",
                                        "zero_optimization.offload_optimizer.nvme_path=\"" + nvme + "\"", chunks};
  std::vector<std::string> params{"zero_optimization.offload_param.device=\"nvme\"",
                                  "zero_optimization.offload_param.nvme_path=\"" + nvme_params + "\"",
                                  "zero_optimization.offload_param.max_in_cpu=0",
                                  "zero_optimization.offload_param.buffer_count=2"};
  std::vector<std::string> both = params;
  both.insert(both.end(), states.begin(), states.end());
  const auto plain = train_on(r, 4, base + "_plain", false);
  struct Variant {
    std::string name;
    std::vector<std::string> flags;
    bool apart;
  };
  const std::vector<Variant> variants{
      {"cpu", cpu, false}, {"cpu_apart", cpu, true}, {"params", params, false}, {"params_states", both, false}};
  auto apart = [](bool on) {
    if (on) ::setenv("SHARDLM_TEST_OFFLOAD_APART", "1", 1);
    else ::unsetenv("SHARDLM_TEST_OFFLOAD_APART");
  };
  auto read_json = [](const std::string& path) {
    nlohmann::json j;
    std::ifstream(path) >> j;
    return j;
  };
  auto expect_as_planned = [&](const std::string& d, const std::string& what) {
    const auto mem = read_json(d + "/memory.json"), plan = read_json(d + "/plan.json")["stages"][0];
    for (const char* key : {"compute_params", "gradients", "master_params", "optimizer_states", "host", "offloaded",
                            "total_model_states"})
      EXPECT_EQ(mem[key], plan[key]) << what << " " << key;
    EXPECT_EQ(mem["master_params"], 0) << what;
  };
  for (const auto& v : variants) {
    const std::string d = base + "_" + v.name;
    apart(v.apart);
    const auto got = train_on(r, 4, d, false, v.flags);
    apart(false);
    if (world->rank() != 0) continue;
    expect_identical_runs(plain, got, "bf16 masters with offload " + v.name);
    expect_as_planned(d, v.name);
  }
  // NVMe states in the GPU layout: 2 steps, then resumed to 4 from the checkpoint.
  const std::string d = base + "_states_apart";
  apart(true);
  train_on(r, 2, d, false, states);
  const auto resumed = train_on(r, 4, d, true, states);
  apart(false);
  if (world->rank() == 0) {
    expect_identical_runs(plain, resumed, "bf16 masters, NVMe states apart, resumed", 2);
    expect_as_planned(d, "nvme apart");
    const auto ref = read_json(base + "_plain/memory.json");
    const auto opt = ref["optimizer_states"].get<int64_t>();  // fp32 moments (8) + compensation (2) per element
    // On disk apart: the bf16 master (2 bytes per shard element) besides the moments and compensation.
    EXPECT_EQ(read_json(d + "/memory.json")["offloaded"].get<int64_t>(), opt * 12 / 10);
    // Parameter and state files in place: the shards (the masters) and the moments and compensation.
    const auto both_mem = read_json(base + "_params_states/memory.json");
    const int64_t moved = ref["compute_params"].get<int64_t>() - both_mem["compute_params"].get<int64_t>();
    EXPECT_EQ(moved, opt / 5);  // every unit sharded (threshold 0): each bf16 shard, 2 bytes per element
    EXPECT_EQ(both_mem["offloaded"].get<int64_t>(), opt + moved);
    for (const auto& dir : {nvme, nvme_params})
      EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the files in " << dir << " outlive the runs";
  }
}

// bf16 masters with parameter offload in a GPU run's layout (SHARDLM_TEST_OFFLOAD_APART: the parameter
// shards are host tensors apart from the device's gather buffers) through the host optimizer
// (offload_optimizer cpu): each host parameter shard IS the host optimizer's bf16 master, one buffer
// (with offload_param nvme the master lives in the parameter files, read for the step and written back).
// ZeRO-3 on 2 ranks, Kahan (compensation with the optimizer state) and stochastic rounding, parameters
// cpu and nvme: 2 steps and a resume from that checkpoint to 4 give the losses and final weights of the
// run without offload bit for bit; memory.json equals plan.json, and `host` holds the master once: the
// shards' bytes (cpu; nvme: `offloaded`), the moments and compensation, the gradient copies, nothing more.
TEST(Bf16Masters, HostParameterShardsAreTheHostOptimizersMasters) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "two ranks";
  for (const std::string rounding : {"kahan", "stochastic"}) {
    const MasterRun r{2, 3, rounding};
    const std::string base = test_support::mpi_test_path(r.name() + "_host_shards");
    const std::string files = base + "_files";
    if (world->rank() == 0) std::filesystem::create_directories(files);
    world->barrier();
    const auto plain = train_on(r, 4, base + "_plain", false);
    for (const std::string params : {"cpu", "nvme"}) {
      const std::string what = "bf16 masters (" + rounding + "), offload_optimizer cpu + offload_param " + params;
      std::vector<std::string> flags{"zero_optimization.offload_optimizer.device=\"cpu\"",
                                     "zero_optimization.sub_group_size=20000",
                                     "zero_optimization.offload_param.device=\"" + params + "\""};
      if (params == "nvme")
        flags.insert(flags.end(), {"zero_optimization.offload_param.nvme_path=\"" + files + "\"",
                                   "zero_optimization.offload_param.max_in_cpu=0",
                                   "zero_optimization.offload_param.buffer_count=2"});
      const std::string d = base + "_" + params;
      ::setenv("SHARDLM_TEST_OFFLOAD_APART", "1", 1);
      const auto first = train_on(r, 2, d, false, flags);
      const auto resumed = train_on(r, 4, d, true, flags);
      ::unsetenv("SHARDLM_TEST_OFFLOAD_APART");
      if (world->rank() != 0) continue;
      ASSERT_EQ(first.history.size(), 2u) << what;
      for (size_t i = 0; i < 2; ++i) EXPECT_EQ(first.history[i].loss, plain.history[i].loss) << what << " step " << i + 1;
      expect_identical_runs(plain, resumed, what + ", resumed from step 2", 2);
      nlohmann::json plan;
      std::ifstream(d + "/plan.json") >> plan;
      const auto& mem = resumed.memory;
      for (const char* key : {"compute_params", "gradients", "master_params", "optimizer_states", "host", "offloaded",
                              "total_model_states"})
        EXPECT_EQ(mem[key], plan["stages"][0][key]) << what << " " << key;
      // Every unit sharded (threshold 0): the shards (2 bytes per element, the bf16 masters) left the device.
      const auto bytes = [](const nlohmann::json& j, const char* key) { return j[key].get<int64_t>(); };
      const int64_t shards = bytes(plain.memory, "compute_params");
      EXPECT_EQ(bytes(mem, "compute_params"), 0) << what;
      EXPECT_EQ(bytes(mem, "master_params") + bytes(mem, "optimizer_states"), 0) << what;
      EXPECT_EQ(bytes(mem, "host"), (params == "cpu" ? shards : 0) + bytes(plain.memory, "gradients") +
                                        bytes(plain.memory, "optimizer_states"))
          << what << ": the host holds each master once (the host shard), no second copy";
      EXPECT_EQ(bytes(mem, "offloaded"), params == "nvme" ? shards : 0) << what;
    }
    if (world->rank() == 0) EXPECT_TRUE(std::filesystem::is_empty(files)) << "the files in " << files << " outlive the runs";
  }
}
