// See zero_runs.h.
#include "zero_runs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "comm/mpi_communicator.h"
#include "io/safetensors.h"
#include "train/trainer.h"
#include "test_dirs.h"
#include "../support/worst_of.h"

namespace shardlm::zero_test {

train::TrainConfig config(int stage, const std::string& precision, const std::string& tag, int steps, double lr) {
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
                                    {"steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=20",
                                     "gradient_clipping=0.5", "resume=false", "train_micro_batch_size_per_gpu=2",
                                     "gradient_accumulation_steps=2", "ddp.bucket_cap_mb=0.1",
                                     "zero_optimization.stage=" + std::to_string(stage),
                                     // small units stay gathered below this; 0 makes every unit sharded
                                     "zero_optimization.stage3_param_persistence_threshold=0",
                                     "zero_optimization.stage3_prefetch_bucket_size=40000"});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = precision == "fp64";
  c.bf16 = precision == "bf16";
  c.fp16.enabled = precision == "fp16";
  if (lr > 0) c.optimizer.lr = lr;
  c.out_dir = test_support::mpi_test_path("zero_" + tag);
  return c;
}

Outcome run_training(const train::TrainConfig& cfg) {
  train::Trainer trainer(cfg, comm::mpi_world(), /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  Outcome o;
  o.history = trainer.run().history;
  comm::mpi_world()->barrier();  // rank 0 writes the files
  if (comm::mpi_world()->rank() != 0) return o;
  for (auto& [name, t] : io::load_safetensors(cfg.out_dir + "/model.safetensors")) o.weights.emplace_back(name, t);
  std::ifstream(cfg.out_dir + "/memory.json") >> o.memory;
  return o;
}

void expect_same(const Outcome& got, const Outcome& ref, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.history.size(), ref.history.size());
  for (size_t i = 0; i < ref.history.size(); ++i) {
    EXPECT_NEAR(got.history[i].loss, ref.history[i].loss, tol.loss * ref.history[i].loss) << what << " step " << i + 1;
    EXPECT_NEAR(got.history[i].grad_norm, ref.history[i].grad_norm, tol.grad_norm * ref.history[i].grad_norm)
        << what << " grad norm, step " << i + 1;
  }
  ASSERT_EQ(got.weights.size(), ref.weights.size());
  double worst = 0, worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < ref.history.size(); ++i) {
    worst_loss = test_support::worst_of(worst_loss, std::abs(got.history[i].loss - ref.history[i].loss) / ref.history[i].loss);
    worst_norm = test_support::worst_of(worst_norm, std::abs(got.history[i].grad_norm - ref.history[i].grad_norm) / ref.history[i].grad_norm);
  }
  for (size_t k = 0; k < ref.weights.size(); ++k) {
    ASSERT_EQ(got.weights[k].first, ref.weights[k].first);
    const auto diff = (got.weights[k].second.to(at::kDouble) - ref.weights[k].second.to(at::kDouble));
    const double rel = (diff.norm() / ref.weights[k].second.to(at::kDouble).norm()).item<double>();
    EXPECT_LT(rel, tol.weights) << what << " final " << ref.weights[k].first;
    worst = test_support::worst_of(worst, rel);
  }
  EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 0.2) << "the reference run should learn";
  std::printf("[ zero     ] %s: worst deviation (relative) in loss %.2e, grad norm %.2e, final weights %.2e\n",
              what.c_str(), worst_loss, worst_norm, worst);
}

}  // namespace shardlm::zero_test
