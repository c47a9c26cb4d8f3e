// ZeRO stages 1-3 reproduce stage 0 (data parallel) on the same ranks: losses, grad norms and
// final weights over 10 steps with accumulation 2 and clipping on, each against stage 0 in the same
// precision: exactly in fp64, to rounding order in fp32, bf16 and fp16. Also: fp16 overflows and
// per-unit loss scaling, stage 1's reductions during the boundary's backward, coalesced buckets, and a
// rank whose gathers start late cannot make the others read half-arrived parameters. Memory and
// hybrid sharding: test_zero_memory.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "data/loader/data_loader.h"
#include "data/loader/token_file.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "parallel/fault_injection.h"
#include "parallel/zero/zero_buckets.h"
#include "parallel/zero/zero_engine.h"
#include "parallel/zero/zero_gather_buckets.h"
#include "parallel/zero/stage3_schedule.h"
#include "train/trainer.h"
#include "model_parallel.h"
#include "reference_runs.h"
#include "zero_runs.h"
#include "test_dirs.h"

using namespace shardlm;
using namespace shardlm::zero_test;

namespace {

void check_stage(int stage, const std::string& precision) {
  // Like with like: stage 0 in the same precision (fp32 stage 0 is DataParallel; bf16/fp16 stage 0
  // keeps a replicated fp32 master and all-reduces 16-bit gradients, as DeepSpeed's stage 0).
  // The layouts differ only in summation order: reduce-scatter vs all-reduce, shard vs whole-tensor
  // norms, and (stages 2-3) gradients accumulated over micro-steps in the fp32 shard instead of
  // the 16-bit buffer. In 16 bits that moves a gradient element by up to one rounding (2^-9 of it
  // in bf16, 2^-12 in fp16), so 16-bit stage 1 equals stage 0 bit for bit and stages 2-3 differ by
  // that rounding carried through 10 Adam steps. lr 1e-3 for all: at 1e-2, Adam's sign-like first
  // steps on near-zero gradients turn any rounding difference into a full step (fp32 weights then
  // differ by 3e-5, bf16 by 9e-2). Bounds: about 3x the worst measured over N = 2 and 4 (printed);
  // fp16 on an AVX-512 FP16 Xeon (native fp16 vector kernels): stages 2-3 at N = 4 deviate by
  // 6.0e-6 / 5.4e-4 / 2.2e-3, above the 1e-5 / 5e-4 / 5e-3 first set from an AVX2 machine.
  const Tolerance tol = precision == "fp64"   ? Tolerance{1e-12, 1e-12, 1e-12}
                        : precision == "fp32" ? Tolerance{3e-7, 5e-5, 5e-6}
                        : precision == "bf16" ? Tolerance{6e-5, 4e-3, 1e-2}
                                              : Tolerance{2e-5, 1.6e-3, 6.5e-3};
  const auto ref_cfg = config(0, precision, "s0_" + precision, 10, 1e-3);
  const auto ref =  // trained once per precision (tests/mpi/reference_runs.h)
      test_support::run_once<Outcome>("stage 0 " + precision, ref_cfg, [&] { return run_training(ref_cfg); });
  const auto got = run_training(config(stage, precision, "s" + std::to_string(stage) + "_" + precision, 10, 1e-3));
  if (comm::mpi_world()->rank() == 0) expect_same(got, ref, tol, "stage " + std::to_string(stage) + " " + precision);
}

}  // namespace

// A wider model in bf16 tracks the same model in fp64: hidden 256, intermediate 1024, 8 heads,
// 4 KV heads, vocab 2048 (k up to 1024 in the products), 10 steps. With products that accumulate
// in fp32 (model/fp32_products.h), bf16 differs from fp64 by rounding weights, activations and
// gradients to 8 significant bits (relative 2^-9 each), which averages out in the loss; a GEMM
// accumulating in bf16 (Debian's libtorch 1.13 on AVX2) adds 1e-2…7e-2 per product, and a bf16
// run then ended with 15% different grad norms. Bounds are about 3x the measured deviation (worst
// of N = 2, 4 on an AVX2 CPU: loss 8.4e-5, grad norm 1.7e-3, final weights 1.1e-2). Runs on
// whatever CPU the suite runs on: the products' path is chosen per CPU.
TEST(Zero, WideBf16ModelTracksFp64) {
  auto world = comm::mpi_world();
  const std::string tokens = test_support::mpi_test_path("wide_tokens.bin");
  if (world->rank() == 0) {  // the bundled corpus folded into a 2048-token vocabulary
    auto ids = data::read_tokens(std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin", data::TokenFormat::LlmcBin)
                   .to_vector();
    ids.resize(200000);
    for (auto& t : ids) t %= 2048;
    data::write_llmc_tokens(tokens, ids);
  }
  // Both runs start from the same fp32 weights (an HF directory, the `init` key).
  auto cfg = config(0, "fp32", "wide", 10, 1e-3).model;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 1024;
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 4;
  cfg.vocab_size = 2048;
  const std::string init = test_support::mpi_test_path("wide_init");
  if (world->rank() == 0) {
    std::filesystem::create_directories(init);
    io::save_safetensors(init + "/model.safetensors", model::Llama(cfg, 42).named_tensors(), {});
    model::write_hf_config(init + "/config.json", cfg);
  }
  world->barrier();
  auto wide = [&](const std::string& precision, int stage) {
    auto c = config(stage, precision, "wide_" + precision, 10, 1e-3);
    c.data.train = tokens;
    c.data.seq_len = 64;
    c.init = init;
    c.model = cfg;
    return run_training(c);
  };
  const auto ref = wide("fp64", 0);
  const auto got = wide("bf16", 1);
  if (world->rank() == 0) expect_same(got, ref, Tolerance{3e-4, 5e-3, 3e-2}, "wide model bf16 vs fp64");
}

TEST(Zero, Stage1MatchesStage0Fp64) { check_stage(1, "fp64"); }
TEST(Zero, Stage2MatchesStage0Fp64) { check_stage(2, "fp64"); }
TEST(Zero, Stage3MatchesStage0Fp64) { check_stage(3, "fp64"); }
TEST(Zero, Stage1MatchesStage0Fp32) { check_stage(1, "fp32"); }

// Coalesced reduce-scatters (parallel/zero/zero_buckets.h) and parameter refreshes
// (zero_gather_buckets.h): bucket sizes of 1e5 put the tiny model's two layers (46 208 elements
// each) in one bucket and the embedding and the head (262 144 each) in buckets of their own; stages
// 1-3 still follow stage 0 to fp64 rounding, and the buckets have the layout of per-unit shards
// (checked through the saved weights and every step's norm).
TEST(Zero, CoalescedReductionsAndGathersMatchStage0Fp64) {
  const auto ref_cfg = config(0, "fp64", "s0_fp64_buckets", 10, 1e-3);  // check_stage's fp64 reference
  const auto ref = test_support::run_once<Outcome>("stage 0 fp64", ref_cfg, [&] { return run_training(ref_cfg); });
  for (int stage : {1, 2, 3}) {
    auto c = config(stage, "fp64", "s" + std::to_string(stage) + "_fp64_buckets", 10, 1e-3);
    c.zero.reduce_bucket_size = 1e5;
    c.zero.allgather_bucket_size = 1e5;
    const auto got = run_training(c);
    if (comm::mpi_world()->rank() == 0)
      expect_same(got, ref, {1e-12, 1e-12, 1e-12}, "stage " + std::to_string(stage) + " fp64, small buckets");
  }
}

// A bucket some of whose units got no gradients is flushed with zeros for them, whatever their
// place in the bucket, and starts the next micro-step empty; an empty unit (another pipeline
// stage's) belongs to no bucket. Units 0 and 1 miss the first micro-step, and the bucket's later
// units were ready: an earlier flush zeroed those again after the launch and then refused their
// next micro-step ("marked ready twice").
TEST(Zero, BucketFlushZeroesMissingUnitsAndStartsTheNextMicroStepEmpty) {
  auto dp = comm::mpi_world();
  const int64_t n = dp->size(), me = dp->rank();
  const std::vector<int64_t> shard_numel = {2, 3, 0, 1, 2};
  std::map<size_t, at::Tensor> got;
  parallel::ReduceScatterBuckets buckets(shard_numel, 1000, dp, at::TensorOptions().dtype(at::kDouble),
                                         [&](size_t u, const at::Tensor& reduced) { got[u] = reduced.clone(); });
  ASSERT_EQ(buckets.buckets(), 1u);
  // Row p of unit u on rank r holds (r + 1) * (10u + p + k) at column k: reduced on rank p, the
  // sum over ranks is n(n+1)/2 * (10u + p + k).
  auto fill = [&](size_t u) {
    auto rows = buckets.send_rows(u);
    ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{n, shard_numel[u]}));
    for (int64_t p = 0; p < n; ++p)
      for (int64_t k = 0; k < shard_numel[u]; ++k) rows[p][k] = (me + 1.0) * (10.0 * u + p + k);
    buckets.unit_ready(u);
  };
  auto expected = [&](size_t u) {
    return (at::arange(shard_numel[u], at::kDouble) + 10.0 * u + me) * (n * (n + 1) / 2.0);
  };
  for (size_t u : {4, 3, 2}) fill(u);
  buckets.flush();
  EXPECT_EQ(got.size(), 4u);  // every non-empty unit, missing ones as zeros
  EXPECT_TRUE(at::equal(got.at(0), at::zeros({2}, at::kDouble)));
  EXPECT_TRUE(at::equal(got.at(1), at::zeros({3}, at::kDouble)));
  for (size_t u : {3, 4}) EXPECT_TRUE(at::allclose(got.at(u), expected(u))) << "unit " << u;
  got.clear();
  for (size_t u : {4, 3, 2, 1, 0}) fill(u);  // the last one launches the bucket
  buckets.complete(/*all=*/true);
  EXPECT_EQ(got.size(), 4u);
  for (size_t u : {0, 1, 3, 4}) EXPECT_TRUE(at::allclose(got.at(u), expected(u))) << "unit " << u;
}

TEST(Zero, Stage2MatchesStage0Fp32) { check_stage(2, "fp32"); }
TEST(Zero, Stage3MatchesStage0Fp32) { check_stage(3, "fp32"); }
TEST(Zero, Stage1Bf16MatchesStage0Bf16) { check_stage(1, "bf16"); }
TEST(Zero, Stage2Bf16MatchesStage0Bf16) { check_stage(2, "bf16"); }
TEST(Zero, Stage3Bf16MatchesStage0Bf16) { check_stage(3, "bf16"); }

TEST(Zero, Stage1Fp16MatchesStage0Fp16) { check_stage(1, "fp16"); }
TEST(Zero, Stage2Fp16MatchesStage0Fp16) { check_stage(2, "fp16"); }
TEST(Zero, Stage3Fp16MatchesStage0Fp16) { check_stage(3, "fp16"); }

// An overflow only one rank can see (an inf written into its own gradient shard) makes every rank
// skip the same step and halve the scale, and training continues (checked on every rank): the
// model-parallel suites' fp16 overflow run (model_parallel.h), at stages 1 and 3.
TEST(Zero, Fp16OverflowOnOneRankSkipsTheStepEverywhere) {
  const int last = comm::mpi_world()->size() - 1;
  for (int stage : {1, 3}) {
    const auto h =
        model_parallel::fp16_run_with_overflow_on(config(stage, "fp16", "overflow" + std::to_string(stage)), last, last);
    EXPECT_EQ(h[2].extra.at("loss_scale"), h[1].extra.at("loss_scale") / 2);
    EXPECT_EQ(h.back().extra.at("skipped_steps"), 1);
  }
}

TEST(Zero, Fp16OverflowAtTheFloorStopsNamingTheUnit) {
  auto cfg = config(2, "fp16", "floor", 4);
  cfg.fp16.loss_scale = 1024;  // static: nothing left to lower
  parallel::FaultInjection faults;
  faults.overflow_rank = 0;
  faults.overflow_step = 1;
  const parallel::FaultScope injected(faults);
  train::Trainer trainer(cfg, comm::mpi_world(), true);
  try {
    trainer.run();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("overflowed at step 2 in unit(s) layers.0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("floor"), std::string::npos) << msg;
  }
}

// A unit whose true gradients are tiny (the embedding, its backward signal attenuated so that its
// largest gradient is ~2e-14) gets all-zero fp16 gradients under one 2^16 scale and never moves;
// with per-unit loss scaling its scale climbs to 2^24, its gradients become non-zero and it
// updates, while the head — large gradients — stays at a lower scale.
TEST(Zero, PerUnitLossScalingRescuesAUnitWithTinyGradients) {
  auto world = comm::mpi_world();
  auto probe = config(1, "fp32", "probe", 1);
  // The embedding's largest true gradient on the first batch, to size the attenuation.
  model::Llama llama(probe.model, probe.seed);
  data::DataLoader loader(std::make_shared<const data::Tokens>(
                              data::read_tokens(probe.data.train, data::TokenFormat::LlmcBin)),
                          probe.micro_batch, probe.data.seq_len, 0, 1);
  const auto batch = loader.batch(0);
  model::cross_entropy_loss(llama.forward(batch.inputs), batch.targets).backward();
  const double largest = llama.parameters()[0].tensor.grad().abs().max().item<double>();
  const auto initial_embedding = llama.parameters()[0].tensor.detach().clone();

  for (bool per_unit : {false, true}) {
    auto cfg = config(1, "fp16", per_unit ? "per_unit" : "global", 12, 1e-3);
    cfg.optimizer.weight_decay = 0;  // an embedding without gradients must then stay exactly as it was
    cfg.fp16.per_unit_loss_scaling = per_unit;
    if (!per_unit) cfg.fp16.loss_scale = 65536;  // one static 2^16 scale
    cfg.fp16.hysteresis = 1;
    parallel::FaultInjection faults;
    faults.attenuate_unit = 0;
    faults.attenuation = 2e-14 / largest;
    const parallel::FaultScope injected(faults);
    const auto out = run_training(cfg);
    if (world->rank() != 0) continue;
    const auto& embedding = out.weights[0].second;
    ASSERT_EQ(out.weights[0].first, "model.embed_tokens.weight");
    const auto& last = out.history.back().extra;
    if (!per_unit) {
      EXPECT_EQ(last.at("loss_scale"), 65536);
      EXPECT_TRUE(at::equal(embedding, initial_embedding)) << "under one 2^16 scale the embedding gradients underflow";
    } else {
      EXPECT_EQ(last.at("loss_scale.embed"), 16777216);  // climbed to the 2^24 cap
      EXPECT_LT(last.at("loss_scale.head"), last.at("loss_scale.embed"));
      const double moved = (embedding - initial_embedding).abs().max().item<double>();
      // Adam's eps (1e-8) dwarfs sqrt(v) of ~1e-13 gradients, so the steps are small but real;
      // under one 2^16 scale the same weights do not move at all (checked above).
      EXPECT_GT(moved, 0) << "per-unit scaling should let the embedding train";
    }
  }
}

// Stage 1 reduce-scatters each unit's accumulated gradient during the backward of the accumulation's
// last micro-step, as soon as the unit's gradients are complete (overlapping the rest of that
// backward, as DeepSpeed's stage 1), and never during an earlier micro-step's: with unit-by-unit
// reductions, every unit's reduce-scatter has been issued when the boundary's backward returns, before
// finish_gradient_sync. (Before, all were issued by finish_gradient_sync.) Unused units still reduce
// there, and the gradients equal stage 0's (Stage1Matches*).
TEST(Zero, Stage1ReducesDuringTheBoundaryBackward) {
  auto world = comm::mpi_world();
  auto cfg = config(1, "fp32", "stage1_overlap", 1);
  model::Llama llama(cfg.model, cfg.seed);
  parallel::ZeroOptions options;
  options.stage = 1;
  options.reduce_bucket_numel = 0;  // unit by unit: one reduce-scatter per unit
  parallel::ZeroEngine engine(llama, world, options, optim::AdamWOptions{});
  data::DataLoader loader(std::make_shared<const data::Tokens>(
                              data::read_tokens(cfg.data.train, data::TokenFormat::LlmcBin)),
                          cfg.micro_batch, cfg.data.seq_len, world->rank(), world->size());
  const size_t units = engine.layout().units.size();
  auto reduce_scatters = [&] {
    const auto& stats = world->stats();
    const auto it = stats.find("reduce_scatter");
    return it == stats.end() ? int64_t{0} : it->second.calls;
  };
  for (int64_t micro = 0; micro < 2; ++micro) {
    const bool boundary = micro == 1;
    engine.prepare_backward(boundary);
    const auto batch = loader.batch(micro);
    const int64_t before = reduce_scatters();
    model::cross_entropy_loss(llama.forward(batch.inputs), batch.targets).backward();
    EXPECT_EQ(reduce_scatters() - before, boundary ? static_cast<int64_t>(units) : 0)
        << (boundary ? "the boundary's backward" : "an earlier micro-step's backward");
  }
  const int64_t before_sync = reduce_scatters();
  engine.finish_gradient_sync();
  EXPECT_EQ(reduce_scatters(), before_sync) << "finish_gradient_sync issued reduce-scatters again";
  EXPECT_TRUE(std::isfinite(engine.grad_sum_of_squares()));
}

TEST(Zero, Stage3DelayedGathersGiveTheSameResult) {
  auto prompt = config(3, "fp32", "nodelay", 3);
  const auto ref = run_training(prompt);
  auto delayed = config(3, "fp32", "delay", 3);
  parallel::FaultInjection faults;
  faults.delay_gather_rank = 1;
  faults.delay_gather_ms = 30;
  const parallel::FaultScope injected(faults);
  const auto got = run_training(delayed);
  if (comm::mpi_world()->rank() != 0) return;
  for (size_t i = 0; i < ref.history.size(); ++i) EXPECT_EQ(got.history[i].loss, ref.history[i].loss);
  for (size_t k = 0; k < ref.weights.size(); ++k)
    EXPECT_TRUE(at::equal(got.weights[k].second, ref.weights[k].second)) << ref.weights[k].first;
}

// Activation checkpointing under ZeRO-3: a unit's recomputation runs in its backward, after the
// re-gather and before its gradients are reduce-scattered and the unit released. Recomputing the
// same ops on the same data must reproduce the run that kept everything, bit for bit, in fp64
// and fp32 (full: every decoder layer; selective: the attention core).
TEST(Zero, Stage3WithActivationCheckpointingIsBitIdentical) {
  for (const std::string precision : {"fp64", "fp32"}) {
    auto ref_cfg = config(3, precision, "ac_none_" + precision, 3);
    ref_cfg.attn_implementation = "eager";  // selective matters most where attention keeps T x T
    const auto ref = run_training(ref_cfg);
    for (const std::string mode : {"full", "selective"}) {
      auto cfg = ref_cfg;
      cfg.activation_checkpointing.mode = mode;
      cfg.out_dir = test_support::mpi_test_path("zero_ac_" + mode + "_" + precision);
      const auto got = run_training(cfg);
      if (comm::mpi_world()->rank() != 0) continue;
      for (size_t i = 0; i < ref.history.size(); ++i) {
        EXPECT_EQ(got.history[i].loss, ref.history[i].loss) << mode << " " << precision << " step " << i + 1;
        EXPECT_EQ(got.history[i].grad_norm, ref.history[i].grad_norm) << mode << " " << precision << " step " << i + 1;
      }
      ASSERT_EQ(got.weights.size(), ref.weights.size());
      for (size_t k = 0; k < ref.weights.size(); ++k)
        EXPECT_TRUE(at::equal(got.weights[k].second, ref.weights[k].second)) << mode << " " << ref.weights[k].first;
    }
  }
}

// The parameter refresh's buckets on their own: units of 5, 3, 40, 0 (not refreshed), 2 and 2
// elements per rank with a cap of 12 x ranks gather as {5, 3}, {40} alone, {2, 2}; shards that are
// views of their unit's buffer (stages 1-2) and separate ones; every unit ends with every rank's
// shard in rank order, and the unit left out is untouched.
TEST(ZeroGatherBuckets, EveryUnitReceivesEveryRanksShardInRankOrder) {
  auto dp = comm::mpi_world();
  const int64_t n = dp->size(), r = dp->rank();
  const std::vector<int64_t> S = {5, 3, 40, 0, 2, 2};
  parallel::AllGatherBuckets buckets(S, 12 * n, dp);
  EXPECT_EQ(buckets.buckets(), 3u);
  std::vector<at::Tensor> shards, flats;
  for (size_t u = 0; u < S.size(); ++u) {
    flats.push_back(at::full({std::max<int64_t>(n * S[u], 1)}, -1.0, at::kDouble));
    const auto mine = at::arange(S[u], at::kDouble) + 1000.0 * r + 100.0 * u;
    if (u % 2 == 0 && S[u] > 0) {  // a view of the unit's own buffer
      shards.push_back(flats[u].narrow(0, r * S[u], S[u]));
      shards.back().copy_(mine);
    } else {
      shards.push_back(mine);
    }
  }
  buckets.gather(shards, flats);
  for (size_t u = 0; u < S.size(); ++u) {
    if (S[u] == 0) {
      EXPECT_TRUE(at::equal(flats[u], at::full({1}, -1.0, at::kDouble)));
      continue;
    }
    std::vector<at::Tensor> rows;
    for (int64_t p = 0; p < n; ++p) rows.push_back(at::arange(S[u], at::kDouble) + 1000.0 * p + 100.0 * u);
    EXPECT_TRUE(at::equal(flats[u], at::cat(rows))) << "unit " << u;
  }
}
