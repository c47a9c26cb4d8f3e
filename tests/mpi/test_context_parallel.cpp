// Context parallelism reproduces one process (issue 43). Every layout trains the tiny model 3 steps
// (clipping on, accumulation 2, sequences of 32 tokens split over c = 2 or 4 ranks in 2c chunks) and
// is compared, step by step (loss, grad norm) and in the final (gathered, HF-shaped) weights, with
// one process training alone on the same sequences: a run of cp ranks reads, as one data-parallel
// rank, exactly what one process reads. fp64 shows every K/V exchange (ring, all-gather, Ulysses
// all-to-all) computes the same function: loss to 1e-12, grad norm and weights to 1e-10. Also: ZeRO-3
// over dp x cp, sliding windows shorter and longer than a chunk, packed fine-tuning rows whose
// samples cross chunk boundaries, mixture-of-experts models (the load-balancing loss and the capacity
// over the whole sequence), and fp32 to 1e-6 in the loss.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "comm/mpi_communicator.h"
#include "data/loader/loss_mask.h"
#include "data/loader/token_file.h"
#include "io/safetensors.h"
#include "test_dirs.h"
#include "trajectory.h"
#include "plan/planner.h"
#include "train/plan_check.h"
#include "train/trainer.h"
#include "util/crc32c.h"

using namespace shardlm;

namespace {

struct CpLayout {
  int cp = 2;
  std::string mode = "p2p";
  int stage = 0;
  std::string precision = "fp64";
  std::vector<std::string> more = {};  // more overrides (model options, data)
  std::string data = "";               // a token file instead of data/brown/train.bin
  std::string tag = "";
  int tp = 1, pp = 1;
  std::string recompute = "none";
  std::string name() const {
    return "cp" + std::to_string(cp) + (tp > 1 ? "_tp" + std::to_string(tp) : "") +
           (pp > 1 ? "_pp" + std::to_string(pp) : "") + "_" + mode + "_zero" + std::to_string(stage) + "_" +
           recompute + "_" + precision + tag;
  }
};

train::TrainConfig config(const CpLayout& l, int cp, int64_t accumulation, const std::string& dir) {
  std::vector<std::string> overrides = {
      "steps=3", "data.val=", "threads=1", "comm.timeout_s=30", "gradient_clipping=0.5", "resume=false",
      "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=" + std::to_string(accumulation),
      "optimizer.params.lr=3e-3", "ddp.bucket_cap_mb=0.1", "zero_optimization.stage=" + std::to_string(l.stage),
      "zero_optimization.stage3_param_persistence_threshold=0", "model.num_hidden_layers=2",
      "parallelism.context_parallel=" + std::to_string(cp), "parallelism.context_parallel_mode=" + l.mode,
      "parallelism.tensor_parallel=" + std::to_string(l.tp), "parallelism.pipeline_parallel=" + std::to_string(l.pp),
      "activation_checkpointing.mode=" + l.recompute};
  overrides.insert(overrides.end(), l.more.begin(), l.more.end());
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  c.data.train = l.data.empty() ? std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin" : l.data;
  c.float64_for_tests = l.precision == "fp64";
  if (l.precision == "fp32") c.optimizer.lr = 1e-3;
  c.out_dir = test_support::mpi_test_path("cp_" + dir);
  return c;
}

test_support::Outcome train_cp(const train::TrainConfig& cfg, comm::CommPtr comm) {
  train::Trainer trainer(cfg, comm, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  test_support::Outcome o;
  o.history = trainer.run().history;
  comm->barrier();  // its rank 0 has written the files
  if (comm->rank() == 0) o.weights = io::load_safetensors(cfg.out_dir + "/model.safetensors");
  return o;
}

// Packed fine-tuning rows (seq_len 32, rows of 33 tokens): samples of 5, 13 and 15 tokens, so their
// starts (0, 5, 18) and ends cross the chunk boundaries of cp 2 (8, 16, 24) and cp 4 (4, 8, ...).
// Every target but a sample's first token counts. Written once per mpirun by rank 0.
std::string packed_rows() {
  const std::string path = test_support::mpi_test_path("cp_packed.bin");
  auto world = comm::mpi_world();
  if (world->rank() == 0) {
    const int64_t rows = 64, len = 33;
    std::mt19937 rng(43);
    std::vector<uint32_t> tokens(static_cast<size_t>(rows * len));
    for (auto& t : tokens) t = rng() % 4096;
    data::write_llmc_tokens(path, tokens);
    std::string bits(static_cast<size_t>(rows * len), static_cast<char>(data::kCountsInLoss));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t start : {0, 5, 18}) bits[static_cast<size_t>(r * len + start)] = static_cast<char>(data::kDocumentStart);
    std::ofstream out(data::sidecar_path(path), std::ios::binary);
    const int32_t head[2] = {data::kLossMaskMagic, data::kLossMaskVersion};
    const int64_t count = rows * len;
    const int32_t shape[2] = {static_cast<int32_t>(len), 1};
    const uint32_t crc = crc32c_file(path);
    const int32_t zero = 0;
    out.write(reinterpret_cast<const char*>(head), 8);
    out.write(reinterpret_cast<const char*>(&count), 8);
    out.write(reinterpret_cast<const char*>(shape), 8);
    out.write(reinterpret_cast<const char*>(&crc), 4);
    out.write(reinterpret_cast<const char*>(&zero), 4);
    out.write(bits.data(), static_cast<std::streamsize>(bits.size()));
  }
  world->barrier();
  return path;
}

// Trains `l` on the whole world (dp = world / cp) and compares it with one process reading the same
// sequences (accumulation x dp).
void expect_reproduces_single_process(const CpLayout& l) {
  auto world = comm::mpi_world();
  const int split = l.cp * l.tp * l.pp;
  if (world->size() % split != 0) GTEST_SKIP() << "needs a multiple of " << split << " ranks";
  const int dp = world->size() / split;
  auto self = world->split(world->rank(), 0, "self");
  CpLayout one = l;
  one.stage = 0, one.tp = 1, one.pp = 1, one.recompute = "none";
  one.more.clear();
  for (const auto& o : l.more)  // the model and data, not the layout
    if (o.rfind("parallelism.", 0) != 0 && o.rfind("zero_optimization.", 0) != 0) one.more.push_back(o);
  const auto ref = train_cp(config(one, 1, 2 * dp, "single_" + l.name() + "_r" + std::to_string(world->rank())), self);
  const auto got = train_cp(config(l, l.cp, 2, l.name()), world);
  if (world->rank() != 0) return;
  const auto d = test_support::deviation_of(got, ref);
  const bool fp64 = l.precision == "fp64";
  EXPECT_LT(d.loss, fp64 ? 1e-12 : 1e-6) << l.name();
  EXPECT_LT(d.grad_norm, fp64 ? 1e-10 : 3e-5) << l.name();
  EXPECT_LT(d.weights, fp64 ? 1e-10 : 2e-5) << l.name();
  EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 0.0) << "the reference run should learn";
  std::printf("[ context-parallel ] %-40s dp=%d: worst relative deviation from one process: loss %.2e, grad norm "
              "%.2e, final weights %.2e\n",
              l.name().c_str(), dp, d.loss, d.grad_norm, d.weights);
}

CpLayout with(CpLayout l, std::vector<std::string> more, std::string tag) {
  l.more = std::move(more);
  l.tag = std::move(tag);
  return l;
}

}  // namespace

TEST(ContextParallel, Cp2RingReproducesOneProcess) { expect_reproduces_single_process({2, "p2p"}); }
TEST(ContextParallel, Cp2AllGatherReproducesOneProcess) { expect_reproduces_single_process({2, "all_gather"}); }
TEST(ContextParallel, Cp2AllToAllReproducesOneProcess) { expect_reproduces_single_process({2, "all_to_all"}); }
TEST(ContextParallel, Cp4RingReproducesOneProcess) { expect_reproduces_single_process({4, "p2p"}); }
TEST(ContextParallel, Cp4AllGatherReproducesOneProcess) { expect_reproduces_single_process({4, "all_gather"}); }
TEST(ContextParallel, Cp4AllToAllReproducesOneProcess) { expect_reproduces_single_process({4, "all_to_all"}); }
TEST(ContextParallel, Cp2RingWithZero3ReproducesOneProcess) { expect_reproduces_single_process({2, "p2p", 3}); }
TEST(ContextParallel, Cp2AllToAllWithZero3ReproducesOneProcess) {
  expect_reproduces_single_process({2, "all_to_all", 3});
}
TEST(ContextParallel, Cp2RingFp32ReproducesOneProcess) { expect_reproduces_single_process({2, "p2p", 0, "fp32"}); }
TEST(ContextParallel, Cp2AllToAllFp32ReproducesOneProcess) {
  expect_reproduces_single_process({2, "all_to_all", 0, "fp32"});
}
// Mistral's window over every layer: 5 tokens (shorter than cp 2's chunks of 8) and 11 (longer), 2 KV
// heads (all_to_all at cp 4 repeats them to one per query head).
TEST(ContextParallel, SlidingWindowShorterThanAChunkReproducesOneProcess) {
  const std::vector<std::string> w = {"model.model_type=mistral", "model.sliding_window=5", "model.num_key_value_heads=2"};
  for (const char* mode : {"p2p", "all_gather", "all_to_all"}) expect_reproduces_single_process(with({2, mode}, w, "_w5"));
}
TEST(ContextParallel, SlidingWindowLongerThanAChunkReproducesOneProcess) {
  const std::vector<std::string> w = {"model.model_type=mistral", "model.sliding_window=11", "model.num_key_value_heads=2"};
  for (const char* mode : {"p2p", "all_gather", "all_to_all"}) expect_reproduces_single_process(with({2, mode}, w, "_w11"));
}
TEST(ContextParallel, PackedRowsAcrossChunksReproduceOneProcess) {
  const auto path = packed_rows();
  for (const char* mode : {"p2p", "all_gather", "all_to_all"}) {
    CpLayout l{2, mode};
    l.data = path;
    l.tag = "_packed";
    expect_reproduces_single_process(l);
  }
}
// Every layout composes: tensor parallelism (with sequence parallelism, heads split over tp, then
// the ring or Ulysses over cp), pipeline stages (each stage's chunks travel between stages), and full
// activation checkpointing (the recomputed exchange repeats its communication).
TEST(ContextParallel, Tp2Cp2ReproducesOneProcess) {
  for (const char* mode : {"p2p", "all_to_all"}) {
    CpLayout l{2, mode};
    l.tp = 2;
    l.more = {"parallelism.sequence_parallel=true"};
    expect_reproduces_single_process(l);
  }
}
TEST(ContextParallel, Pp2Cp2ReproducesOneProcess) {
  for (const char* mode : {"p2p", "all_gather"}) {
    CpLayout l{2, mode, 1};
    l.pp = 2;
    expect_reproduces_single_process(l);
  }
}
TEST(ContextParallel, Cp2FullRecomputeWithZero3ReproducesOneProcess) {
  for (const char* mode : {"p2p", "all_to_all"}) {
    CpLayout l{2, mode, 3};
    l.recompute = "full";
    expect_reproduces_single_process(l);
  }
}
// cp 4's chunks of 4 positions: the packed samples (starts 0, 5, 18) and a window of 5 span several.
TEST(ContextParallel, Cp4PackedRowsAndWindowReproduceOneProcess) {
  const auto path = packed_rows();
  for (const char* mode : {"p2p", "all_gather", "all_to_all"}) {
    CpLayout l{4, mode};
    l.data = path;
    l.tag = "_packed_w5";
    l.more = {"model.model_type=mistral", "model.sliding_window=5", "model.num_key_value_heads=2"};
    expect_reproduces_single_process(l);
  }
}

// Mixture of experts: the load-balancing loss's sums and a capacity count over the whole sequence,
// as one process counts them. A capacity factor of 1 drops assignments in every step here, each
// expert keeping its first ones in the whole sequence's token order (chunk r's before chunk
// 2c-1-r's, and other ranks' chunks in between).
const std::vector<std::string> kMixtralCapped = {
    "model.model_type=mixtral", "model.num_local_experts=4", "model.num_experts_per_tok=2",
    "model.intermediate_size=64", "model.output_router_logits=true", "model.router_aux_loss_coef=0.05",
    "model.moe_capacity_factor=1.0"};
// These layouts run once, on 2 ranks (the suite's 4-rank run repeats only what needs 4).
#define ON_TWO_RANKS() \
  if (comm::mpi_world()->size() != 2) GTEST_SKIP() << "once, on 2 ranks"
TEST(ContextParallel, MixtralAuxLossAndCapacityReproduceOneProcess) {
  ON_TWO_RANKS();
  expect_reproduces_single_process(with({2, "p2p"}, kMixtralCapped, "_mixtral"));
}
// Qwen2-MoE (a shared expert beside the routed ones, a dense layer) at cp 4 with ZeRO-3.
TEST(ContextParallel, Cp4Qwen2MoeReproducesOneProcess) {
  expect_reproduces_single_process(with({4, "p2p", 3},
                                        {"model.model_type=qwen2_moe", "model.num_experts=4", "model.num_experts_per_tok=2",
                                         "model.moe_intermediate_size=32", "model.shared_expert_intermediate_size=48",
                                         "model.mlp_only_layers=[1]", "model.output_router_logits=true",
                                         "model.router_aux_loss_coef=0.05", "model.moe_capacity_factor=1.25"},
                                        "_qwen2_moe"));
}

// Offload: ZeRO-2 with the optimizer states in files (offload_optimizer nvme), the AdamW step read
// and written chunk by chunk.
TEST(ContextParallel, Cp2NvmeOptimizerOffloadReproducesOneProcess) {
  ON_TWO_RANKS();
  const std::string dir = test_support::mpi_test_path("cp_nvme_states");
  if (comm::mpi_world()->rank() == 0) std::filesystem::create_directories(dir);
  comm::mpi_world()->barrier();
  expect_reproduces_single_process(with({2, "p2p", 2},
                                        {"zero_optimization.offload_optimizer.device=\"nvme\"",
                                         "zero_optimization.offload_optimizer.nvme_path=\"" + dir + "\"",
                                         "zero_optimization.sub_group_size=20000"},
                                        "_nvme"));
}
// Hybrid sharding over dp x cp (4 ranks: shards of 2, two replicas; cp 2) and expert parallelism
// (the experts of a cp pair split over it: each rank's tokens reach the other's experts).
TEST(ContextParallel, Cp2WithHybridZero3ReproducesOneProcess) {
  if (comm::mpi_world()->size() != 4) GTEST_SKIP() << "shards of 2 in 2 replicas need 4 ranks";
  expect_reproduces_single_process(
      with({2, "p2p", 3}, {"parallelism.hybrid_shard=true", "parallelism.shard_group_size=2"}, "_hybrid2"));
}
TEST(ContextParallel, Cp2WithEp2ReproducesOneProcess) {
  ON_TWO_RANKS();
  auto more = kMixtralCapped;
  more.push_back("parallelism.expert_parallel=2");
  expect_reproduces_single_process(with({2, "all_to_all", 3}, more, "_ep2"));
}

// The memory guard (device_memory) counts each rank's positions: a per-rank limit between the plans
// of cp 1 and cp 2 (one sequence of 1024 tokens per rank, the tiny model) refuses cp 1,
// naming context_parallel as the fix, and cp 2 trains under it.
TEST(ContextParallel, DeviceMemoryRefusesCp1AndTrainsCp2) {
  ON_TWO_RANKS();
  auto world = comm::mpi_world();
  CpLayout l{1, "p2p"};
  l.precision = "fp32";
  l.more = {"data.seq_len=1024", "model.max_position_embeddings=1024", "train_micro_batch_size_per_gpu=1", "steps=1"};
  auto whole = config(l, 1, 1, "limit_cp1");
  auto split = config(l, 2, 1, "limit_cp2");
  const auto total = [&](const train::TrainConfig& c) {
    return plan::make_plan(train::plan_request(c, 2, c.zero.stage, c.micro_batch)).stages.front().memory.total();
  };
  const int64_t at_cp1 = total(whole), at_cp2 = total(split);
  ASSERT_LT(at_cp2, at_cp1) << "cp 2 must plan fewer bytes per rank";
  whole.device_memory = split.device_memory = static_cast<double>(at_cp1 + at_cp2) / 2;
  try {
    train::Trainer refused(whole, world, true);
    ADD_FAILURE() << "cp 1 started under device_memory " << whole.device_memory << " (plan " << at_cp1 << ")";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not fit device_memory"), std::string::npos) << what;
    EXPECT_NE(what.find("--parallelism.context_parallel=2"), std::string::npos) << what;
  }
  const auto got = train_cp(split, world);
  EXPECT_EQ(got.history.size(), 1u);
  if (world->rank() == 0)
    std::printf("[ context-parallel ] device_memory %.1f MB: cp 1 plans %.1f MB (refused), cp 2 %.1f MB (trained)\n",
                whole.device_memory / 1e6, static_cast<double>(at_cp1) / 1e6, static_cast<double>(at_cp2) / 1e6);
}
