// The planner reproduces the textbook figures, the ZeRO arithmetic and Megatron's tensor-parallel
// layout and communication, and recommends along the decision tree users know. (Equality with the trainer's measured memory.json: tests/mpi/test_zero.cpp.)
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
// The tiny model planned on `devices` with tensor-parallel size tp, sequence 16, fp32.
plan::PlanRequest tiny_request(int devices, int tp) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.devices = devices;
  r.tp = tp;
  r.seq_len = 16;
  r.precision = "fp32";
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

// ---- tensor parallelism: the real Megatron layout (parallel/tensor/tp_layout.h) -----------------
// The "tiny" preset: vocab 128, hidden 64, 4 heads of 16, 2 KV heads, MLP 176, 2 layers, untied head.
// Elements per rank at tp=2, by hand:
//   embed_tokens 128/2 x 64                                          =  4096
//   per layer: q 32x64 = 2048, k and v 1 KV head 16x64 = 1024 each, o 64x32 = 2048,
//              gate and up 88x64 = 5632 each, down 64x88 = 5632, two norms 64 each = 23168
//   norm 64 + lm_head 64x64                                          =  4160
//   4096 + 2 x 23168 + 4160                                          = 54592 (of 108864)
TEST(PlannerTensorParallel, ModelStatesAreTheShardsOneRankHolds) {
  const auto cfg = model::preset("tiny");
  const int64_t held = 54592;
  const auto s0 = plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 2);
  EXPECT_EQ(s0.compute_params, 4 * held);
  EXPECT_EQ(s0.gradients, 4 * held);
  EXPECT_EQ(s0.master_params, 0);
  EXPECT_EQ(s0.optimizer_states, 8 * held);
  EXPECT_EQ(s0.model_states(), 16 * held);  // 873472 bytes
  // Stage 3 over dp=3, bf16 compute, fp32 gradient shards, nothing persistent: each unit padded to a
  // multiple of 3 (4096 -> 4098, 23168 -> 23169, 4160 -> 4161), 54597 / 3 = 18199 elements owned.
  const int64_t shard = 18199;
  const auto s3 = plan::model_state_bytes(cfg, 3, 3, "bf16", "fp32", /*persistence_threshold=*/0, 2);
  EXPECT_EQ(s3.compute_params, 2 * shard);
  EXPECT_EQ(s3.gradients, 4 * shard);
  EXPECT_EQ(s3.master_params, 4 * shard);
  EXPECT_EQ(s3.optimizer_states, 8 * shard);
  EXPECT_EQ(s3.model_states(), 18 * shard);  // 327582 bytes

  // make_plan: 4 devices = tp 2 x dp 2; no division beyond the layout.
  const auto p = plan::make_plan(tiny_request(4, 2));
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.parameters, 108864);
  EXPECT_EQ(p.rank_parameters, held);
  EXPECT_EQ(p.stages[0].memory.model_states(), 16 * held);
  EXPECT_EQ(p.stages[0].comm_bytes.at("all_reduce"), 4.0 * held) << "data parallelism moves this rank's shards";
  EXPECT_NE(plan::format_plan(p).find("each rank holds 54592 of the 108864 parameters"), std::string::npos);
}

TEST(PlannerTensorParallel, KvHeadsReplicatedWhenTpExceedsThem) {
  // tp=4 with 2 KV heads: each rank holds one whole KV head (16 rows of k and of v), not 32/4 = 8.
  //   embed 32x64 = 2048; per layer q 16x64 = 1024, k, v 16x64 = 1024 each, o 64x16 = 1024,
  //   gate, up 44x64 = 2816 each, down 64x44 = 2816, norms 128 = 12672; head 64 + 32x64 = 2112.
  //   2048 + 2 x 12672 + 2112 = 29504 (8 x 64 = 512 more per layer than an even split of k and v).
  const auto cfg = model::preset("tiny");
  const int64_t held = 29504;
  EXPECT_EQ(plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 4).model_states(), 16 * held);
  auto r = tiny_request(4, 4);
  const auto p = plan::make_plan(r);
  EXPECT_EQ(p.rank_parameters, held);
  // Their gradients are summed over the 2 ranks sharing each head: k and v, 16 x 64 fp32, per layer.
  EXPECT_DOUBLE_EQ(p.stages[0].comm_bytes.at("tp_kv_all_reduce"), 2 * 2 * 16 * 64 * 4.0);
  // tp=2 splits the KV heads: nothing to sum.
  r.tp = 2;
  EXPECT_EQ(plan::make_plan(r).stages[0].comm_bytes.count("tp_kv_all_reduce"), 0u);
}

TEST(PlannerTensorParallel, CommunicationFollowsTheMegatronFormula) {
  // tiny, b=2, s=16, h=64, L=2, t=2, accumulation 3. n = b s h = 2048 elements.
  // Per micro-step: (4L + 2) = 10 all-reduces of n (2 + 2 per layer, embedding, head) and the
  // loss's 3 of b s = 32 fp32 values.
  const auto cfg = model::preset("tiny");
  const auto fp32 = plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "fp32", "none", 2, false);
  ASSERT_EQ(fp32.size(), 1u);
  EXPECT_DOUBLE_EQ(fp32.at("tp_all_reduce"), 3 * (10 * 2048 * 4 + 3 * 32 * 4));  // 246912
  const auto bf16 = plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "bf16", "none", 2, false);
  EXPECT_DOUBLE_EQ(bf16.at("tp_all_reduce"), 3 * (10 * 2048 * 2 + 3 * 32 * 4));  // 124032
  // Full recomputation runs each layer's 2 forward all-reduces again.
  const auto full = plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "fp32", "full", 2, false);
  EXPECT_DOUBLE_EQ(full.at("tp_all_reduce"), 3 * (14 * 2048 * 4 + 3 * 32 * 4));  // 345216
  EXPECT_TRUE(plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "fp32", "none", 1, false).empty());

  auto r = tiny_request(2, 2);
  r.micro_batch = 2;
  r.accumulation = 3;
  const auto p = plan::make_plan(r);
  for (const auto& s : p.stages) EXPECT_DOUBLE_EQ(s.comm_bytes.at("tp_all_reduce"), 246912);
  EXPECT_NE(plan::format_plan(p).find("tp_all_reduce"), std::string::npos);
}

TEST(PlannerTensorParallel, SequenceParallelTradesEachAllReduceForAReduceScatterAndAnAllGather) {
  const auto cfg = model::preset("tiny");
  for (int t : {2, 4}) {
    SCOPED_TRACE("t=" + std::to_string(t));
    const auto ar = plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "fp32", "none", t, false);
    const auto sp = plan::tensor_parallel_comm_bytes(cfg, 2, 16, 3, "fp32", "none", t, true);
    const double loss = 3 * 3 * 32 * 4.0, activations = ar.at("tp_all_reduce") - loss;
    EXPECT_DOUBLE_EQ(activations, 3 * 10 * 2048 * 4.0);
    // Bytes contributed: the reduce-scatter's input is the full n, the all-gather's n / t.
    EXPECT_DOUBLE_EQ(sp.at("tp_reduce_scatter"), activations);
    EXPECT_DOUBLE_EQ(sp.at("tp_all_gather"), activations / t);
    // Ring volume sent per rank: all-reduce 2(t-1)/t n = reduce-scatter (t-1)/t n + all-gather (t-1) n/t.
    const double ring_ar = 2.0 * (t - 1) / t * activations;
    EXPECT_DOUBLE_EQ(double(t - 1) / t * sp.at("tp_reduce_scatter") + (t - 1) * sp.at("tp_all_gather"), ring_ar);
    // Still all-reduced: the loss's 3 sums and the norm weights' gradients, (2L + 1) x 64 fp32.
    EXPECT_DOUBLE_EQ(sp.at("tp_all_reduce"), loss + 3 * 5 * 64 * 4.0);
  }
}

TEST(PlannerTensorParallel, ActivationsSplitOnlyTheParallelRegionsWithoutSequenceParallelism) {
  // tiny, fp32, fused attention, b=2, T=16 (32 tokens), per token: a norm 3 x 64 x 4 = 768 bytes
  // (input, normalised, weighted), attention and MLP 4 x 64 x 4 + 4 x 176 x 4 + 4 heads x 4 = 3856,
  // head logits 4 x 128.
  const auto cfg = model::preset("tiny");
  auto held = [&](int tp, bool sp) { return plan::estimate_activations(cfg, 2, 16, "fp32", "none", tp, 1, true, sp).held; };
  EXPECT_EQ(held(1, false), 2 * 32 * (2 * 768 + 3856) + 32 * (768 + 512));  // 386048
  // tp=2: attention, MLP and logits halve; the norms stay whole on every rank.
  EXPECT_EQ(held(2, false), 2 * (2 * 32 * 768 + 32 * 3856 / 2) + 32 * 768 + 32 * 512 / 2);  // 254464
  // tp=2 with SP: the norms run on half the sequence, but the column products keep the gathered
  // full input (64 x 4 bytes per token after each norm).
  const int64_t norm_sp = 32 * (768 - 256) / 2 + 32 * 256;
  EXPECT_EQ(held(2, true), 2 * (2 * norm_sp + 32 * 3856 / 2) + norm_sp + 32 * 512 / 2);  // 213504
  // Full recomputation keeps each layer's input: the residual stream, whole without SP.
  const auto full = plan::estimate_activations(cfg, 2, 16, "fp32", "full", 2, 1, true, false);
  const auto full_sp = plan::estimate_activations(cfg, 2, 16, "fp32", "full", 2, 1, true, true);
  EXPECT_EQ(full.held, 2 * 32 * 64 * 4 + 32 * 768 + 32 * 512 / 2);
  EXPECT_EQ(full_sp.held, 2 * 32 * 64 * 4 / 2 + norm_sp + 32 * 512 / 2);
}

TEST(PlannerTensorParallel, RefusesLayoutsMegatronCannotMake) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");  // 4 heads
  r.model_name = "tiny";
  r.devices = 3;
  r.tp = 3;
  r.seq_len = 16;
  try {
    plan::make_plan(r);
    FAIL() << "tp=3 with 4 heads must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 / 3"), std::string::npos) << e.what();
  }
  r.devices = 2;
  r.tp = 2;
  r.sequence_parallel = true;
  r.seq_len = 15;
  EXPECT_THROW(plan::make_plan(r), Error);  // sequence parallelism needs t | seq_len
  r.tp = 1;
  r.seq_len = 16;
  EXPECT_THROW(plan::make_plan(r), Error);  // and tp > 1
}

TEST(PlannerTensorParallel, EmittedConfigCarriesTheParallelismAndCheckpointing) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.devices = 4;
  r.tp = 2;
  r.sequence_parallel = true;
  r.recompute = "selective";
  r.seq_len = 64;
  const auto p = plan::make_plan(r);
  const auto j = plan::recommended_config(p);
  EXPECT_EQ(j["parallelism"]["tensor_parallel"], 2);
  EXPECT_EQ(j["parallelism"]["sequence_parallel"], true);
  EXPECT_EQ(j["parallelism"]["pipeline_parallel"], 1);
  EXPECT_EQ(j["activation_checkpointing"]["mode"], "selective");
  const data::testing::TempDir dir;
  const std::string path = dir.file("emitted_tp.json");
  std::ofstream(path) << j.dump(2);
  const auto cfg = train::load_train_config(path, {});
  EXPECT_EQ(cfg.parallelism.tensor_parallel, 2);
  EXPECT_TRUE(cfg.parallelism.sequence_parallel);
  EXPECT_EQ(cfg.activation_checkpointing.mode, "selective");

  // Beyond what ZeRO can save, the recommendation picks a tensor-parallel size the model allows.
  plan::PlanRequest big;
  big.model = model::preset("llama-70b");
  big.model_name = "llama-70b";
  big.devices = 64;
  big.seq_len = 2048;
  big.device_memory = plan::parse_bytes("80GB");
  const auto q = plan::make_plan(big);
  const auto k = plan::recommended_config(q);
  EXPECT_EQ(k["parallelism"]["tensor_parallel"], 8);
  EXPECT_EQ(k["parallelism"]["sequence_parallel"], true);
  EXPECT_EQ(k["parallelism"]["pipeline_parallel"], 8);
  EXPECT_EQ(k["activation_checkpointing"]["mode"], "full");
}

// ---- pipeline parallelism: each stage's own parameters and micro-batches in flight ----------------
namespace {
// tiny with 4 decoder layers, planned on 2 devices as pp=2 (dp=1, tp=1), fp32, zero stage 0.
plan::PlanRequest tiny_pipeline(bool tied) {
  auto r = tiny_request(2, 1);
  r.model.num_hidden_layers = 4;
  r.model.tie_word_embeddings = tied;
  r.pp = 2;
  r.zero_stage = 0;
  r.accumulation = 4;
  return r;
}
}  // namespace

TEST(PlannerPipeline, EachStageHoldsItsUnitsParametersAt16BytesEachInFp32) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied head");
    const auto r = tiny_pipeline(tied);
    const auto& cfg = r.model;
    // By hand from the config: embedding V x h; a layer's q, k, v, o, gate, up, down and two norms;
    // the head's final norm and (untied) lm_head V x h.
    const int64_t h = cfg.hidden_size, f = cfg.intermediate_size, V = cfg.vocab_size,
                  kv = cfg.num_key_value_heads * cfg.head_dim();
    const int64_t embedding = V * h, layer = 2 * h * h + 2 * kv * h + 3 * f * h + 2 * h;
    const int64_t head = h + (tied ? 0 : V * h);
    const int64_t stage0 = embedding + 2 * layer;                        // embedding + layers 0-1
    const int64_t stage1 = 2 * layer + head + (tied ? embedding : 0);    // layers 2-3 + norm + head (+ its copy)
    EXPECT_EQ(stage0, 100608);
    EXPECT_EQ(stage1, 100672);  // tied: the 64-element norm and the 8192-element copy, as untied's lm_head

    const auto p = plan::make_plan(r);
    ASSERT_EQ(p.stages.size(), 1u);
    ASSERT_EQ(p.pipeline_stages.size(), 2u);
    const auto& s0 = p.pipeline_stages[0];
    const auto& s1 = p.pipeline_stages[1];
    EXPECT_EQ(s0.first_unit, 0u);
    EXPECT_EQ(s0.last_unit, 2u);
    EXPECT_EQ(s1.first_unit, 3u);
    EXPECT_EQ(s1.last_unit, 5u);
    EXPECT_EQ(s0.layers, 2);
    EXPECT_EQ(s1.layers, 2);
    EXPECT_FALSE(s0.embedding_copy);
    EXPECT_EQ(s1.embedding_copy, tied);
    EXPECT_EQ(s0.parameters, stage0);
    EXPECT_EQ(s1.parameters, stage1);
    EXPECT_EQ(s0.memory[0].model_states(), 16 * stage0);
    EXPECT_EQ(s1.memory[0].model_states(), 16 * stage1);
    EXPECT_EQ(s0.memory[0].compute_params, 4 * stage0);
    EXPECT_EQ(s1.memory[0].optimizer_states, 8 * stage1);
    EXPECT_EQ(plan::pipeline_model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 1, 2, 1).model_states(), 16 * stage1);
    // The ZeRO-stage column is the largest pipeline stage: what must fit.
    const auto& peak = s0.memory[0].total() >= s1.memory[0].total() ? s0 : s1;
    EXPECT_EQ(p.stages[0].peak_pipeline_stage, peak.stage);
    EXPECT_EQ(p.stages[0].memory.total(), peak.memory[0].total());

    // Activations: each stage's layers per micro-batch, the output stage 0 sends on, the head on
    // stage 1 (fp32: the received input is the first norm's saved input). One micro-batch of each,
    // less the boundary tensor, is the whole model's single-device estimate.
    const auto whole = plan::estimate_activations(cfg, r.micro_batch, r.seq_len, "fp32", "none", 1, 1);
    const int64_t boundary = r.micro_batch * r.seq_len * h * 4;
    const auto a0 = plan::estimate_pipeline_stage_activations(cfg, r.micro_batch, r.seq_len, "fp32", "none", 1, 2, 0, 1);
    const auto a1 = plan::estimate_pipeline_stage_activations(cfg, r.micro_batch, r.seq_len, "fp32", "none", 1, 2, 1, 1);
    EXPECT_EQ(a0.held + a1.held - boundary, whole.held);
    EXPECT_EQ(s0.micro_batches_alive, 2);  // 1F1B: min(p - s, m)
    EXPECT_EQ(s1.micro_batches_alive, 1);
    EXPECT_EQ(s0.memory[0].activations, 2 * a0.held);
    EXPECT_EQ(s1.memory[0].activations, a1.held);

    const auto j = plan::plan_to_json(p);
    ASSERT_EQ(j["pipeline_stages"].size(), 2u);
    EXPECT_EQ(j["pipeline_stages"][1]["parameters"], stage1);
    EXPECT_EQ(j["pipeline_stages"][1]["memory"][0]["total_model_states"], 16 * stage1);
    const auto text = plan::format_plan(p);
    EXPECT_NE(text.find("per pipeline stage"), std::string::npos) << text;
    EXPECT_NE(text.find("pp stage 1"), std::string::npos) << text;
  }
}

TEST(PlannerPipeline, OneFOneBKeepsPMinusSMicroBatchesGPipeKeepsAll) {
  EXPECT_EQ(plan::pipeline_micro_batches_alive("1f1b", 4, 0, 8), 4);
  EXPECT_EQ(plan::pipeline_micro_batches_alive("1f1b", 4, 3, 8), 1);
  EXPECT_EQ(plan::pipeline_micro_batches_alive("1f1b", 4, 0, 2), 2);  // fewer micro-batches than stages
  EXPECT_EQ(plan::pipeline_micro_batches_alive("gpipe", 4, 0, 8), 8);
  auto r = tiny_pipeline(false);
  r.devices = 4;
  r.pp = 4;
  r.accumulation = 8;
  const auto one_f_one_b = plan::make_plan(r);
  r.pipeline_schedule = "gpipe";
  const auto gpipe = plan::make_plan(r);
  ASSERT_EQ(one_f_one_b.pipeline_stages.size(), 4u);
  EXPECT_EQ(one_f_one_b.pipeline_stages[0].micro_batches_alive, 4);
  EXPECT_EQ(gpipe.pipeline_stages[0].micro_batches_alive, 8);
  EXPECT_EQ(gpipe.pipeline_stages[0].memory[0].activations, 2 * one_f_one_b.pipeline_stages[0].memory[0].activations);
  EXPECT_EQ(gpipe.pipeline_stages[0].memory[0].model_states(), one_f_one_b.pipeline_stages[0].memory[0].model_states());
  EXPECT_DOUBLE_EQ(gpipe.pipeline_bubble, 3.0 / 11.0);
  r.pipeline_schedule = "interleaved";
  EXPECT_THROW(plan::make_plan(r), Error);
}

// What offload keeps off the device is printed beside the device's total, and only when there is any.
TEST(Planner, TextShowsOffloadedBytesApartFromTheDeviceTotal) {
  auto r = tiny_request(1, 1);
  r.zero_stage = 1;
  const auto plain = plan::make_plan(r);
  EXPECT_EQ(plan::format_plan(plain).find("+ on disk (NVMe)"), std::string::npos);
  r.offload_optimizer_nvme = true;
  const auto off = plan::make_plan(r);
  const auto text = plan::format_plan(off);
  // The tiny model in fp32: the moments (the master is the parameter) move to disk.
  ASSERT_EQ(off.stages.size(), 1u);  // the requested ZeRO stage only
  ASSERT_EQ(off.stages[0].stage, 1);
  EXPECT_EQ(off.stages[0].memory.offloaded, plain.stages[0].memory.optimizer_states);
  EXPECT_GT(off.stages[0].memory.offloaded, 0);
  const auto row = text.find("+ on disk (NVMe)");
  ASSERT_NE(row, std::string::npos) << text;
  EXPECT_NE(text.find("+ host (offload)"), std::string::npos);
  EXPECT_LT(text.find("= total"), row);
}
