// Data parallelism reproduces single-process training: N ranks with micro-batch B follow the
// trajectory (losses, grad norms, final weights) of 1 rank with batch N*B, and gradient
// accumulation k x B follows batch k*B. The reference runs in the same job on a one-rank
// communicator, so both see identical data, seeds and code.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "comm/mpi_communicator.h"
#include "data/loader/token_file.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "test_dirs.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

train::TrainConfig tiny_config(int64_t micro_batch, int64_t accum, const std::string& tag, bool fp64 = false) {
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
                                    {"steps=5", "data.val=", "threads=1", "gradient_clipping=0.5", "resume=false",
                                     "ddp.bucket_cap_mb=0.1"});  // several buckets, clipping active
  c.micro_batch = micro_batch;
  c.grad_accum = accum;
  c.float64_for_tests = fp64;
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = test_support::mpi_test_path("ddp_" + tag);
  return c;
}

struct RunResult {
  train::TrainResult result;
  std::vector<at::Tensor> weights;
};

RunResult train_ddp(const train::TrainConfig& cfg, comm::CommPtr comm) {
  train::Trainer trainer(cfg, comm, /*quiet=*/true);
  RunResult run{trainer.run(), {}};
  for (const auto& p : trainer.model().parameters()) run.weights.push_back(p.tensor.detach().clone());
  return run;
}

// fp32: sums over ranks run in another order than the single-process sums, so losses agree to
// ~1e-6 and weights per tensor to ~1e-5..1e-4 in norm (Adam turns last-bit differences of
// near-zero gradient elements into visible steps: m/sqrt(v) is scale-free). fp64 removes that
// noise and holds everything to 1e-9.
void expect_same_trajectory(const RunResult& got, const RunResult& ref, bool fp64) {
  const double loss_tol = fp64 ? 1e-10 : 1e-5, norm_tol = fp64 ? 1e-9 : 1e-4, weight_tol = fp64 ? 1e-9 : 1e-3;
  ASSERT_EQ(got.result.history.size(), ref.result.history.size());
  for (size_t i = 0; i < ref.result.history.size(); ++i) {
    const auto &g = got.result.history[i], &r = ref.result.history[i];
    EXPECT_NEAR(g.loss, r.loss, loss_tol * std::abs(r.loss)) << "loss at step " << i + 1;
    EXPECT_NEAR(g.grad_norm, r.grad_norm, norm_tol * r.grad_norm) << "grad norm at step " << i + 1;
  }
  EXPECT_GT(ref.result.history.front().grad_norm, 0.5) << "clipping should be active in this test";
  for (size_t k = 0; k < ref.weights.size(); ++k) {
    const auto diff = got.weights[k] - ref.weights[k];
    EXPECT_LT((diff.norm() / ref.weights[k].norm()).item<double>(), weight_tol) << "final weights of parameter " << k;
    if (fp64) {
      EXPECT_LT(diff.abs().max().item<double>(), 1e-9) << "final weights of parameter " << k;
    }
  }
  // The weights did move: a trainer that does nothing would pass the comparisons above.
  EXPECT_GT(ref.result.history.front().loss - ref.result.history.back().loss, 0.1);
}

void check_dp_matches_single(int64_t micro, int64_t accum, bool fp64) {
  auto world = comm::mpi_world();
  const int n = world->size();
  auto self = world->split(world->rank(), 0, "self");
  RunResult ref;
  const std::string tag = std::to_string(micro) + "x" + std::to_string(accum) + (fp64 ? "_fp64" : "_fp32");
  if (world->rank() == 0) ref = train_ddp(tiny_config(micro * accum * n, 1, "ref" + tag, fp64), self);
  RunResult got = train_ddp(tiny_config(micro, accum, "dp" + tag, fp64), world);
  if (world->rank() == 0) expect_same_trajectory(got, ref, fp64);
  // Every rank ends with the same weights.
  for (const auto& w : got.weights) {
    auto mx = w.clone(), mn = w.clone();
    world->all_reduce(mx, comm::ReduceOp::Max);
    world->all_reduce(mn, comm::ReduceOp::Min);
    ASSERT_TRUE(at::equal(mx, mn));
  }
}

}  // namespace

TEST(DataParallel, NRanksWithMicroBatchBMatchOneRankWithBatchNB) { check_dp_matches_single(2, 1, false); }
TEST(DataParallel, NRanksMatchOneRankExactlyInFloat64) { check_dp_matches_single(2, 1, true); }
// k micro-steps of B on each of N ranks == one step of k*B*N on one rank.
TEST(DataParallel, AccumulationKxBMatchesBatchKB) { check_dp_matches_single(2, 2, false); }
TEST(DataParallel, AccumulationMatchesExactlyInFloat64) { check_dp_matches_single(2, 2, true); }

TEST(DataParallel, NoCommunicationBeforeTheAccumulationBoundary) {
  auto world = comm::mpi_world();
  auto cfg = tiny_config(2, 3, "comm_count");
  cfg.steps = 2;
  train::Trainer trainer(cfg, world, true);
  auto res = trainer.run();
  // Per step: one all-reduce per bucket at the boundary + one for the logged loss, whatever the accumulation.
  const double buckets_bytes = res.history[0].extra.at("comm_all_reduce_bytes");
  const int64_t grad_bytes = trainer.model().num_parameters() * 4;
  EXPECT_EQ(static_cast<int64_t>(buckets_bytes), grad_bytes + 8);
}

TEST(DataParallel, InitStartsEveryRankFromExactlyTheGivenWeights) {
  auto world = comm::mpi_world();
  const std::string golden = std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/tiny";
  // The golden tiny model has a 128-token vocabulary: train it on ids below 128.
  const std::string tokens = test_support::mpi_test_path("init_tokens.bin");
  if (world->rank() == 0) {
    std::vector<uint32_t> ids(4096);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7919) % 128);
    data::write_llmc_tokens(tokens, ids);
  }
  world->barrier();
  auto cfg = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
                                      {"init=" + golden, "model={}", "data.val=", "data.train=" + tokens, "resume=false",
                                       "out_dir=" + test_support::mpi_test_path("init_test")});
  EXPECT_EQ(cfg.model.vocab_size, 128);
  train::Trainer trainer(cfg, world, true);
  std::map<std::string, at::Tensor> file;
  for (auto& [name, t] : io::load_safetensors(golden + "/model.safetensors")) file[name] = t;
  for (const auto& p : trainer.model().parameters()) ASSERT_TRUE(at::equal(p.tensor, file.at(p.name))) << p.name;
}
