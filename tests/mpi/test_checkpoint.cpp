// Sharded checkpoints (src/train/checkpoint.h) on every layout. Same layout: 4 steps straight equal
// 2 steps + resume + 2 steps bit for bit (losses, grad norms, final weights) for DDP, ZeRO 1-3,
// bf16, fp16 (loss-scaler state restored, an injected overflow skipped after the resume), TP and
// PP. Another layout (reshard on load): the resumed trajectory continues the saved layout's
// straight run to summation-order rounding in fp64 (bounds as tests/mpi/model_parallel.cpp:
// every layout equals one process to 1e-12 in the loss). A run that passes the end of its token file
// on 2 ranks and resumes on 1 or 4 reads what one process reads (the order is a function of the global
// sample). The whole matrix runs in CI, on 2, 3 and 4 ranks (layouts a world cannot hold are skipped).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "../support/worst_of.h"
#include "comm/mpi_communicator.h"
#include "data/loader/token_file.h"
#include "io/safetensors.h"
#include "parallel/fault_injection.h"
#include "reference_runs.h"
#include "test_dirs.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

struct Layout {
  int tp = 1, pp = 1, stage = 0;
  int cp = 1;  // context-parallel ranks per sequence (read as one data-parallel rank)
  std::string precision = "fp64";
  int ranks = 0;  // 0: the whole world; else the first `ranks` world ranks
  int windows = 4;  // token windows per step (dp x accumulation): layouts compared read the same data
  std::vector<std::string> model = {};  // more model.* overrides (a family's options); `family` names them
  std::string family = "";
  std::string data = "";  // a token file instead of data/brown/train.bin
  std::string name() const {
    return family + (cp > 1 ? "cp" + std::to_string(cp) + "_" : "") + "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_zero" + std::to_string(stage) + "_" + precision +
           "_n" + std::to_string(ranks) + "_w" + std::to_string(windows);
  }
  int size() const { return ranks ? ranks : comm::mpi_world()->size(); }
  int64_t accumulation() const { return windows / (size() / (tp * pp * cp)); }
  bool fits() const {
    const int n = size();
    return n <= comm::mpi_world()->size() && n % (tp * pp * cp) == 0 && windows % (n / (tp * pp * cp)) == 0;
  }
};

train::TrainConfig config(const Layout& l, int64_t steps, const std::string& dir, bool resume) {
  std::vector<std::string> overrides = {"steps=" + std::to_string(steps), "data.val=", "threads=1", "comm.timeout_s=60", "gradient_clipping=0.5",
       std::string("resume=") + (resume ? "true" : "false"), "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=" + std::to_string(l.accumulation()), "optimizer.params.lr=3e-3",
       "ddp.bucket_cap_mb=0.1", "zero_optimization.stage=" + std::to_string(l.stage),
       "zero_optimization.stage3_param_persistence_threshold=0", "parallelism.tensor_parallel=" + std::to_string(l.tp),
       "parallelism.pipeline_parallel=" + std::to_string(l.pp), "parallelism.context_parallel=" + std::to_string(l.cp),
       "model.num_hidden_layers=2",
       "scheduler.type=WarmupCosineLR", "scheduler.params.total_num_steps=4", "scheduler.params.warmup_num_steps=1"};
  overrides.insert(overrides.end(), l.model.begin(), l.model.end());
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  if (c.data.blend.empty())
    c.data.train = l.data.empty() ? std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin" : l.data;
  c.float64_for_tests = l.precision == "fp64";
  c.bf16 = l.precision == "bf16";
  c.fp16.enabled = l.precision == "fp16";
  c.fp16.loss_scale_window = 2;  // the scale doubles within the run: its restored state matters
  c.out_dir = dir;
  return c;
}

struct CheckpointOutcome {
  std::vector<observe::StepMetrics> history;
  io::NamedTensors weights;  // rank 0 of the run's ranks
};

// Trains `l` on its ranks (others wait); fp16 injects one overflow at step 4 (after any resume).
CheckpointOutcome train_on(const Layout& l, int64_t steps, const std::string& dir, bool resume) {
  auto world = comm::mpi_world();
  const int n = l.size();
  auto group = world->split(world->rank() < n ? 0 : 1, world->rank(), "ckpt_test");
  CheckpointOutcome o;
  if (world->rank() < n) {
    parallel::FaultInjection faults;
    if (l.precision == "fp16" && world->rank() == 0) {
      faults.overflow_rank = 0;
      faults.overflow_step = 3;
    }
    const parallel::FaultScope injected(faults);
    train::Trainer trainer(config(l, steps, dir, resume), group, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
    o.history = trainer.run().history;
    group->barrier();
    if (group->rank() == 0) o.weights = io::load_safetensors(dir + "/model.safetensors");
  }
  world->barrier();
  return o;
}

constexpr size_t kSteps = 4;

// `l`'s kSteps straight steps, the run its resumes are held to: trained once per layout and world
// size (tests/mpi/reference_runs.h), since a resume test and the reshards from the layout share it.
CheckpointOutcome straight_run(const Layout& l) {
  const std::string dir = test_support::mpi_test_path("ckpt_straight_" + l.name());
  const std::string inputs = l.name() + " " + test_support::joined(l.model) + " data " + l.data + " ranks " +
                             std::to_string(l.size()) + " of " + std::to_string(comm::mpi_world()->size());
  return test_support::run_once<CheckpointOutcome>(inputs, config(l, kSteps, dir, false),
                                         [&] { return train_on(l, kSteps, dir, false); });
}

bool same_bits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void expect_resume_bit_exact(const Layout& l) {
  auto world = comm::mpi_world();
  if (!l.fits()) GTEST_SKIP() << l.name() << " does not fit " << world->size() << " ranks";
  const auto straight = straight_run(l);
  const std::string dir = test_support::mpi_test_path("ckpt_resumed_" + l.name());
  train_on(l, kSteps / 2, dir, false);
  const auto resumed = train_on(l, kSteps, dir, true);
  if (world->rank() != 0) return;
  ASSERT_EQ(resumed.history.size(), kSteps / 2) << l.name();
  for (size_t i = 0; i < kSteps / 2; ++i) {
    const auto &a = straight.history[kSteps / 2 + i], &b = resumed.history[i];
    EXPECT_EQ(a.step, b.step);
    EXPECT_TRUE(same_bits(a.loss, b.loss)) << l.name() << " step " << a.step << ": " << a.loss << " vs " << b.loss;
    EXPECT_TRUE(same_bits(a.grad_norm, b.grad_norm)) << l.name() << " step " << a.step;
    if (l.precision == "fp16") {
      EXPECT_EQ(a.extra.at("loss_scale"), b.extra.at("loss_scale")) << "step " << a.step;
    }
  }
  if (l.precision == "fp16") {
    EXPECT_EQ(resumed.history[1].extra.at("skipped"), 1) << "the injected overflow at step 4";
  }
  ASSERT_EQ(straight.weights.size(), resumed.weights.size());
  for (size_t k = 0; k < straight.weights.size(); ++k)
    EXPECT_TRUE(at::equal(straight.weights[k].second, resumed.weights[k].second)) << straight.weights[k].first;
}

// Saves after 2 steps on `from`, resumes on `to` for 2 more: the loss and final weights continue
// `from`'s straight run to fp64 rounding (the same windows each step: both keep the global batch).
void expect_reshard_continues(const Layout& from, const Layout& to) {
  auto world = comm::mpi_world();
  for (const auto& l : {from, to})
    if (!l.fits()) GTEST_SKIP() << l.name() << " does not fit " << world->size() << " ranks";
  const auto straight = straight_run(from);
  const std::string dir = test_support::mpi_test_path("ckpt_reshard_" + from.name() + "_to_" + to.name());
  train_on(from, kSteps / 2, dir, false);
  const auto resumed = train_on(to, kSteps, dir, true);
  if (world->rank() != 0) return;
  ASSERT_EQ(resumed.history.size(), kSteps / 2);
  double loss = 0, weights = 0;
  for (size_t i = 0; i < kSteps / 2; ++i) {
    const auto& ref = straight.history[kSteps / 2 + i];
    loss = test_support::worst_of(loss, std::abs(resumed.history[i].loss - ref.loss) / ref.loss);
  }
  ASSERT_EQ(straight.weights.size(), resumed.weights.size());
  for (size_t k = 0; k < straight.weights.size(); ++k) {
    const auto a = resumed.weights[k].second.to(at::kDouble), b = straight.weights[k].second.to(at::kDouble);
    weights = test_support::worst_of(weights, ((a - b).norm() / b.norm()).item<double>());
  }
  EXPECT_LT(loss, 1e-12) << from.name() << " -> " << to.name();
  EXPECT_LT(weights, 5e-12) << from.name() << " -> " << to.name();
  std::printf("[ checkpoint ] %s -> %s: after resume, worst relative deviation loss %.2e, final weights %.2e\n",
              from.name().c_str(), to.name().c_str(), loss, weights);
}

Layout zero(int stage, const std::string& precision = "fp64") {
  Layout l;
  l.stage = stage;
  l.precision = precision;
  return l;
}
Layout ranks(Layout l, int n, int windows = 4) {
  l.ranks = n;
  l.windows = windows;
  return l;
}
Layout tp(int t, int stage = 0) {
  Layout l;
  l.tp = t;
  l.stage = stage;
  return l;
}
Layout pp(int p, int stage = 0, const std::string& precision = "fp64") {
  Layout l;
  l.pp = p;
  l.stage = stage;
  l.precision = precision;
  return l;
}

// Context parallelism: every sequence over c ranks, which ZeRO shards over with the data-parallel ones.
Layout cp(int c, int stage) {
  Layout l;
  l.cp = c;
  l.stage = stage;
  return l;
}

// Qwen2 (q/k/v biases, a window on layer 1) with a vocabulary tp = 2 pads (4099 -> 4100).
Layout qwen2(Layout l) {
  l.model = {"model.model_type=qwen2", "model.use_sliding_window=true", "model.sliding_window=6",
             "model.max_window_layers=1", "model.vocab_size=4099"};
  l.family = "qwen2_";
  return l;
}

// Training windows in the seeded order of data.shuffle (a function of the global sample, not of
// the ranks), or sequences blended from two datasets by weight (data.blend), also shuffled.
Layout shuffled(Layout l) {
  l.model.push_back("data.shuffle=true");
  l.family += "shuffled_";
  return l;
}
// Hybrid sharding: ZeRO within shard groups of `g` data-parallel ranks, replicated across them.
Layout hybrid(Layout l, int g) {
  l.model.push_back("parallelism.hybrid_shard=true");
  l.model.push_back("parallelism.shard_group_size=" + std::to_string(g));
  l.family += "hybrid" + std::to_string(g) + "_";
  return l;
}
Layout blended(Layout l) {
  const std::string dir = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/";
  l.model.push_back("data.blend=[0.7, \"" + dir + "train.bin\", 0.3, \"" + dir + "val.bin\"]");
  l.model.push_back("data.train=");
  l.family += "blended_";
  return shuffled(l);
}

// A token file of 7 windows of micro-batch 2 x seq_len 32 (the first 7 x 64 + 1 tokens of
// data/brown/train.bin), written once by rank 0: at 4 windows a step, step 2 passes its end.
Layout seven_windows(Layout l) {
  auto world = comm::mpi_world();
  l.data = test_support::mpi_test_path("seven_windows.bin");
  if (world->rank() == 0 && !std::filesystem::exists(l.data)) {
    auto ids = data::read_tokens(std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin", data::TokenFormat::LlmcBin)
                   .to_vector();
    ids.resize(7 * 64 + 1);
    data::write_llmc_tokens(l.data, ids, 16);
  }
  world->barrier();
  l.family += "seven_windows_";
  return l;
}

// The sequential order wraps per global sample (data_loader.h): global sample k reads window k mod 7.
// Steps 1-2 on `from` ranks (step 2 reads windows 4, 5, 6, 0), saved, then steps 3-4 on `to` ranks
// (windows 1-4, 5, 6, 0, 1) equal one process's 4 steps to fp64 rounding. (Before, 2 ranks wrapped after
// 3 micro-steps of 2 windows and read window 0 as sample 6, 4 ranks after 1 micro-step.)
void expect_wrap_resume_matches_one_process(int from, int to) {
  auto world = comm::mpi_world();
  const Layout one = seven_windows(ranks(zero(0), 1)), a = seven_windows(ranks(zero(0), from)),
               b = seven_windows(ranks(zero(0), to));
  for (const auto& l : {a, b})
    if (!l.fits()) GTEST_SKIP() << l.name() << " does not fit " << world->size() << " ranks";
  const auto straight = train_on(one, kSteps, test_support::mpi_test_path("wrap_" + one.name()), false);
  const std::string dir = test_support::mpi_test_path("wrap_" + a.name() + "_to_" + b.name());
  const auto first = train_on(a, kSteps / 2, dir, false);
  const auto resumed = train_on(b, kSteps, dir, true);
  if (world->rank() != 0) return;
  ASSERT_EQ(straight.history.size(), kSteps);
  ASSERT_EQ(first.history.size(), kSteps / 2);
  ASSERT_EQ(resumed.history.size(), kSteps / 2);
  double loss = 0, norm = 0, weights = 0;
  for (size_t i = 0; i < kSteps; ++i) {
    const auto& got = i < kSteps / 2 ? first.history[i] : resumed.history[i - kSteps / 2];
    const auto& ref = straight.history[i];
    EXPECT_EQ(got.step, ref.step);
    loss = test_support::worst_of(loss, std::abs(got.loss - ref.loss) / ref.loss);
    norm = test_support::worst_of(norm, std::abs(got.grad_norm - ref.grad_norm) / ref.grad_norm);
  }
  ASSERT_EQ(straight.weights.size(), resumed.weights.size());
  for (size_t k = 0; k < straight.weights.size(); ++k) {
    const auto x = resumed.weights[k].second.to(at::kDouble), y = straight.weights[k].second.to(at::kDouble);
    weights = test_support::worst_of(weights, ((x - y).norm() / y.norm()).item<double>());
  }
  std::printf("[ checkpoint ] past the end of a 7-window file, %d -> %d ranks against one process: worst relative "
              "deviation loss %.2e, grad norm %.2e, final weights %.2e\n", from, to, loss, norm, weights);
  EXPECT_LE(loss, 1e-12);
  EXPECT_LE(norm, 1e-12);
  EXPECT_LE(weights, 1e-12);
}

}  // namespace

TEST(CheckpointDataWrap, TwoRanksPastTheEndResumeOnOne) { expect_wrap_resume_matches_one_process(2, 1); }
TEST(CheckpointDataWrap, TwoRanksPastTheEndResumeOnFour) { expect_wrap_resume_matches_one_process(2, 4); }

// The padding of a vocabulary tp does not divide never reaches the checkpoint's tensors: a tp = 2
// save resumes on tp = 1 (and back) with the HF shapes.
TEST(CheckpointReshard, Tp2PaddedVocabQwen2ToZero3) { expect_reshard_continues(qwen2(tp(2, 1)), qwen2(zero(3))); }
TEST(CheckpointReshard, Zero1Qwen2ToTp2PaddedVocab) { expect_reshard_continues(qwen2(zero(1)), qwen2(tp(2, 0))); }
TEST(Checkpoint, Tp2PaddedVocabQwen2ResumesBitExact) { expect_resume_bit_exact(qwen2(tp(2, 1))); }

// The resume and reshard matrix (about 1 s a test on 2 ranks; layouts that do not fit the world are skipped).
TEST(Checkpoint, Zero2Fp16ResumesBitExactWithScalerState) { expect_resume_bit_exact(zero(2, "fp16")); }
TEST(CheckpointReshard, Tp2Zero1ToDp2Zero2) { expect_reshard_continues(tp(2, 1), zero(2)); }
TEST(CheckpointReshard, Dp2ToDp4Zero3) { expect_reshard_continues(ranks(zero(3), 2), ranks(zero(3), 4)); }
// Three ranks pad the units 3 does not divide (the embedding's 4096 x 64 by 2 elements), two do not.
TEST(CheckpointReshard, Dp3PaddedToDp2Zero3ToZero1) {
  expect_reshard_continues(ranks(zero(3), 3, 6), ranks(zero(1), 2, 6));
}

TEST(Checkpoint, DdpFp64ResumesBitExact) { expect_resume_bit_exact(zero(0)); }
TEST(Checkpoint, DdpFp32ResumesBitExact) { expect_resume_bit_exact(zero(0, "fp32")); }
TEST(Checkpoint, Zero1Bf16ResumesBitExact) { expect_resume_bit_exact(zero(1, "bf16")); }
TEST(Checkpoint, Zero3Fp32ResumesBitExact) { expect_resume_bit_exact(zero(3, "fp32")); }
TEST(Checkpoint, Zero3Bf16ResumesBitExact) { expect_resume_bit_exact(zero(3, "bf16")); }
TEST(Checkpoint, Tp2Zero1ResumesBitExact) { expect_resume_bit_exact(tp(2, 1)); }
TEST(Checkpoint, Pp2ResumesBitExact) { expect_resume_bit_exact(pp(2)); }
TEST(Checkpoint, Pp2Zero3Bf16ResumesBitExact) { expect_resume_bit_exact(pp(2, 3, "bf16")); }
TEST(CheckpointReshard, Zero3ToZero1) { expect_reshard_continues(zero(3), zero(1)); }
TEST(CheckpointReshard, Pp2ToPp1) { expect_reshard_continues(pp(2), zero(3)); }
TEST(CheckpointReshard, Dp4ToDp2Zero3) { expect_reshard_continues(ranks(zero(3), 4), ranks(zero(3), 2)); }
// Half the ranks with accumulation doubled read the same global samples in the shuffled and the
// blended order, so the resumed run continues the straight one to fp64 rounding.
TEST(CheckpointReshard, ShuffledDp4ToDp2Zero3) {
  expect_reshard_continues(shuffled(ranks(zero(3), 4)), shuffled(ranks(zero(3), 2)));
}
TEST(CheckpointReshard, ShuffledDp2ToDp1Zero1) {
  expect_reshard_continues(shuffled(ranks(zero(1), 2)), shuffled(ranks(zero(1), 1)));
}
TEST(CheckpointReshard, BlendedDp2ToDp1Zero3) {
  expect_reshard_continues(blended(ranks(zero(3), 2)), blended(ranks(zero(3), 1)));
}
TEST(Checkpoint, BlendedZero3ResumesBitExact) { expect_resume_bit_exact(blended(zero(3))); }
// Hybrid sharding saves each piece once (the first replica's shard groups) and reshards to and from
// ZeRO over all ranks, and to another shard group size.
TEST(Checkpoint, HybridZero3ResumesBitExact) { expect_resume_bit_exact(hybrid(ranks(zero(3), 4), 2)); }
TEST(Checkpoint, HybridBf16Zero2ResumesBitExact) { expect_resume_bit_exact(hybrid(ranks(zero(2, "bf16"), 2), 1)); }
TEST(CheckpointReshard, HybridShardsOf2ToZero3Over4) {
  expect_reshard_continues(hybrid(ranks(zero(3), 4), 2), ranks(zero(3), 4));
}
TEST(CheckpointReshard, Zero1Over4ToHybridShardsOf2Zero3) {
  expect_reshard_continues(ranks(zero(1), 4), hybrid(ranks(zero(3), 4), 2));
}
TEST(CheckpointReshard, HybridShardsOf1ToHybridShardsOf2) {
  expect_reshard_continues(hybrid(ranks(zero(3), 2), 1), hybrid(ranks(zero(3), 4), 2));
}
TEST(CheckpointReshard, Zero0ToZero2) { expect_reshard_continues(zero(0), zero(2)); }
TEST(CheckpointReshard, Pp1ToPp2) { expect_reshard_continues(zero(1), pp(2, 1)); }
TEST(CheckpointReshard, Tp2Zero3ToDdp) { expect_reshard_continues(tp(2, 3), zero(0)); }
TEST(CheckpointReshard, Tp1ToTp2) { expect_reshard_continues(zero(0), tp(2)); }

// A checkpoint names tensors and element ranges, not ranks: a context-parallel run resumes bit for
// bit, and continues on a layout without context parallelism (ZeRO-3 over dp x cp -> ZeRO-1 over dp).
TEST(Checkpoint, Cp2Zero3ResumesBitExact) { expect_resume_bit_exact(cp(2, 3)); }
TEST(CheckpointReshard, Cp2Zero3ToZero1) { expect_reshard_continues(cp(2, 3), zero(1)); }
TEST(CheckpointReshard, Zero1ToCp2Zero2) { expect_reshard_continues(zero(1), cp(2, 2)); }
