// The planner reproduces the textbook figures and the ZeRO arithmetic, and recommends along the
// decision tree users know. (Equality with the trainer's measured memory.json: tests/mpi/test_zero.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../data/test_helpers.h"
#include "plan/planner.h"
#include "train/config.h"
#include "util/error.h"

using namespace shardlm;

namespace {
plan::PlanRequest bare(double params, int devices, const std::string& precision = "bf16") {
  plan::PlanRequest r;
  r.params_override = static_cast<int64_t>(params);
  r.devices = devices;
  r.precision = precision;
  return r;
}
}  // namespace

TEST(Planner, TextbookFigures) {
  // Llama-7B, mixed-precision Adam: 16 bytes per parameter = 112 GB of model states.
  const auto p = plan::make_plan(bare(7e9, 8));
  EXPECT_EQ(p.stages[0].memory.model_states(), 112'000'000'000);
  // 8-rank data parallel: 896 GB in total, 784 GB of it redundant.
  EXPECT_EQ(p.stages[0].memory.model_states() * 8, 896'000'000'000);
  EXPECT_EQ(p.stages[0].memory.model_states() * 8 - p.stages[3].memory.model_states() * 8, 784'000'000'000);
  // GPT-3 175B: 350 GB of fp16 weights.
  EXPECT_EQ(plan::make_plan(bare(175e9, 1, "fp16")).stages[0].memory.compute_params, 350'000'000'000);
  EXPECT_NE(plan::format_plan(p).find("896.0 GB of model states in total, 784.0 GB of it redundant"), std::string::npos);
}

TEST(Planner, ZeroPaperArithmetic) {
  const double psi = 1e9;
  const int n = 8;
  const auto p = plan::make_plan(bare(psi, n));
  ASSERT_EQ(p.stages.size(), 4u);
  EXPECT_DOUBLE_EQ(p.stages[0].memory.model_states(), 16 * psi);
  EXPECT_DOUBLE_EQ(p.stages[1].memory.model_states(), 4 * psi + 12 * psi / n);
  EXPECT_DOUBLE_EQ(p.stages[2].memory.model_states(), 2 * psi + 14 * psi / n);
  EXPECT_DOUBLE_EQ(p.stages[3].memory.model_states(), 16 * psi / n);
  // Stage 3 moves 1.5x the data of stages 0-2.
  EXPECT_DOUBLE_EQ(p.stages[3].comm_model_multiple, 1.5 * p.stages[0].comm_model_multiple);
}

TEST(Planner, RecommendsAlongTheDecisionTree) {
  plan::PlanRequest r;
  r.model = model::preset("llama-7b");
  r.model_name = "llama-7b";
  r.devices = 8;
  r.seq_len = 2048;
  r.device_memory = plan::parse_bytes("1TB");
  EXPECT_EQ(plan::make_plan(r).recommended_stage, 0);  // fits: data parallel
  r.device_memory = plan::parse_bytes("32GB");
  const auto p = plan::make_plan(r);
  EXPECT_EQ(p.recommended_stage, 3);  // 2-8x short
  EXPECT_EQ(p.recommended_recompute, "full");
  EXPECT_GE(p.reasons.size(), 2u);
  r.model = model::preset("llama-70b");
  r.model_name = "llama-70b";
  r.devices = 64;
  r.device_memory = plan::parse_bytes("80GB");
  const auto big = plan::make_plan(r);
  EXPECT_EQ(big.recommended_tp, 8);  // tensor parallel within a node...
  EXPECT_EQ(big.recommended_pp, 8);  // ...pipeline across nodes
  r.pp = 4;
  r.tp = 2;
  r.accumulation = 8;
  EXPECT_DOUBLE_EQ(plan::make_plan(r).pipeline_bubble, 3.0 / 11.0);  // (p-1)/(m+p-1)
}

TEST(Planner, JsonUsesTheTrainersCategoryNamesAndTheEmittedConfigLoads) {
  plan::PlanRequest r;
  r.model = model::preset("demo");
  r.model_name = "demo";
  r.devices = 2;
  r.seq_len = 256;
  r.device_memory = plan::parse_bytes("16GB");
  const auto p = plan::make_plan(r);
  const auto j = plan::plan_to_json(p);
  for (const char* k : {"compute_params", "gradients", "master_params", "optimizer_states", "gathered_peak",
                        "total_model_states"})
    EXPECT_TRUE(j["stages"][0].contains(k)) << k;
  const data::testing::TempDir dir;
  const std::string path = dir.file("emitted_config.json");
  std::ofstream(path) << plan::recommended_config(p).dump(2);
  const auto cfg = train::load_train_config(path, {});
  EXPECT_EQ(cfg.zero.stage, p.recommended_stage);
  EXPECT_EQ(cfg.model.hidden_size, 384);
}

TEST(Planner, ParsesSizesAndRejectsNonsense) {
  EXPECT_DOUBLE_EQ(plan::parse_bytes("32GB"), 32e9);
  EXPECT_DOUBLE_EQ(plan::parse_bytes("80GiB"), 80.0 * (1ll << 30));
  EXPECT_DOUBLE_EQ(plan::parse_bytes("500mb"), 500e6);
  EXPECT_THROW(plan::parse_bytes("lots"), Error);
  EXPECT_THROW(plan::parse_bytes("3 parsecs"), Error);
  EXPECT_THROW(plan::make_plan(bare(1e9, 6, "fp8")), Error);
  plan::PlanRequest too_long;
  too_long.model = model::preset("demo");
  too_long.seq_len = 4096;
  EXPECT_THROW(plan::make_plan(too_long), Error);
}

TEST(Planner, FusedAttentionDropsTheHeadsTimesTSquaredTerm) {
  // Eager attention keeps the fp32 probabilities (plus their 16-bit copy in bf16): heads x T per
  // token per layer; a fused kernel keeps one fp32 log-sum-exp per head and token instead.
  const auto cfg = model::preset("llama-1b");
  const int64_t b = 2, T = 2048, L = cfg.num_hidden_layers, a = cfg.num_attention_heads;
  const auto eager = plan::activation_bytes(cfg, b, T, "bf16", "none", 1, 1, /*fused_attention=*/false);
  const auto fused = plan::activation_bytes(cfg, b, T, "bf16", "none", 1, 1, /*fused_attention=*/true);
  EXPECT_EQ(eager - fused, L * b * T * (a * T * (4 + 2) - a * 4));
  EXPECT_LT(fused, eager / 3) << "at T=2048 the probabilities dominate the eager estimate";
}

TEST(Planner, ActivationCheckpointingKeepsLessAndRebuildsOneLayerAtATime) {
  const auto cfg = model::preset("llama-1b");
  const int64_t b = 2, T = 2048, L = cfg.num_hidden_layers, h = cfg.hidden_size;
  const auto none = plan::estimate_activations(cfg, b, T, "bf16", "none", 1, 1, true);
  const auto full = plan::estimate_activations(cfg, b, T, "bf16", "full", 1, 1, true);
  const auto selective = plan::estimate_activations(cfg, b, T, "bf16", "selective", 1, 1, false);
  const auto eager = plan::estimate_activations(cfg, b, T, "bf16", "none", 1, 1, false);
  EXPECT_EQ(none.recompute_peak, 0);
  const int64_t head = none.held - L * full.recompute_peak;  // none = L layers + head
  EXPECT_EQ(full.held, L * b * T * h * 2 + head) << "full keeps each layer's bf16 input";
  EXPECT_LT(selective.held, eager.held / 3) << "selective drops eager attention's T x T probabilities";
  EXPECT_GT(selective.recompute_peak, 0);
}
