// LoRA on data-parallel layouts: DDP and ZeRO stages 1-3 train the adapters (and nothing of the
// frozen base, which every rank holds whole) as one process does, in float64: loss to 1e-12, grad norm and final adapters to 1e-10.
// One process trains alone on the same token windows with accumulation dp x a (docs/data.md). The
// tiny model, 2 layers, 4 steps: seconds per layout. Also: ZeRO's units hold only the adapters.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/mpi_communicator.h"
#include "io/safetensors.h"
#include "test_dirs.h"
#include "trajectory.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

train::TrainConfig lora_config(int stage, int64_t accumulation, const std::string& tag) {
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
                                    {"steps=4", "data.val=", "threads=1", "comm.timeout_s=30", "resume=false",
                                     "train_micro_batch_size_per_gpu=2",
                                     "gradient_accumulation_steps=" + std::to_string(accumulation),
                                     "optimizer.params.lr=3e-3", "ddp.bucket_cap_mb=0.01",
                                     "zero_optimization.stage=" + std::to_string(stage), "model.num_hidden_layers=2",
                                     "lora.enabled=true", "lora.r=4", "lora.lora_alpha=8",
                                     "lora.target_modules=all-linear", "lora.init_lora_weights=false"});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = true;
  c.out_dir = test_support::mpi_test_path("lora_" + tag);
  return c;
}

test_support::Outcome train_on(const train::TrainConfig& cfg, comm::CommPtr comm, int64_t* trainable = nullptr) {
  train::Trainer trainer(cfg, comm, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  test_support::Outcome o;
  o.history = trainer.run().history;
  if (trainable) *trainable = trainer.model().num_parameters();
  comm->barrier();
  if (comm->rank() == 0) o.weights = io::load_safetensors(cfg.out_dir + "/adapter_model.safetensors");
  return o;
}

}  // namespace

TEST(Lora, DdpAndZeroStagesEqualOneProcessInFp64) {
  auto world = comm::mpi_world();
  const int dp = world->size();
  auto self = world->split(world->rank(), 0, "self");
  int64_t trainable = 0;
  const auto ref = train_on(lora_config(0, 2 * dp, "single_r" + std::to_string(world->rank())), self, &trainable);
  // 2 layers x 7 linears, each r x in + out x r (hidden 128 ... of the tiny preset).
  EXPECT_GT(trainable, 0);
  for (int stage : {0, 1, 2, 3}) {
    int64_t held = 0;
    const auto got = train_on(lora_config(stage, 2, "stage" + std::to_string(stage)), world, &held);
    EXPECT_EQ(held, trainable) << "stage " << stage << ": parameters() must be the adapters alone";
    if (world->rank() != 0) continue;
    const auto d = test_support::deviation_of(got, ref);
    EXPECT_LT(d.loss, 1e-12) << "stage " << stage;
    EXPECT_LT(d.grad_norm, 1e-10) << "stage " << stage;
    EXPECT_LT(d.weights, 1e-10) << "stage " << stage;
    EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 1e-3) << "the reference run should learn";
    EXPECT_EQ(got.weights.size(), 28u);
    std::printf("[ lora ] zero stage %d, dp=%d: worst relative deviation from one process: loss %.2e, grad norm %.2e, "
                "adapters %.2e\n", stage, dp, d.loss, d.grad_norm, d.weights);
  }
}
