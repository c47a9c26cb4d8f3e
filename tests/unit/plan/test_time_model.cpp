// The time model (plan/time_model.h) prices the planned work at a profile's rates: its FLOP count
// equals the textbook 6 N tokens plus attention, computed here from the parameter count; each phase
// scales with the rate that prices it and with nothing else; recomputation, the pipeline's fill and
// the collectives' calls follow their definitions; the profile reads back what it wrote and refuses
// what it does not know; --search lists only layouts that fit, fastest first.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "model/llama_config.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "util/error.h"
#include "../../support/error_of.h"

using namespace shardlm;

namespace {

// One rate for every shape of every dtype; collectives with no latency at bus bandwidth `busbw`.
plan::MachineProfile flat_profile(double gemm, double attention, double stream, double optimizer, double busbw = 1e9) {
  plan::MachineProfile p;
  p.ranks = 2;
  for (const char* dt : {"fp32", "bf16"}) {
    p.gemm.push_back({dt, 64, 64, 64, gemm});
    p.attention_forward[dt] = attention;
    p.attention_backward[dt] = attention;
  }
  p.stream_bytes_per_s = stream;
  p.optimizer_elements_per_s = optimizer;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p"})
    for (int64_t bytes : {1 << 10, 1 << 30}) {
      const double t = bytes * plan::collective_bus_factor(op, 2) / busbw;
      p.collectives.push_back({op, bytes, busbw, t});
    }
  return p;
}

plan::PlanRequest tiny(int devices, int64_t micro_batch = 2, int64_t seq = 32) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.devices = devices;
  r.micro_batch = micro_batch;
  r.seq_len = seq;
  r.precision = "fp32";
  return r;
}

constexpr double kHuge = 1e30;  // a rate that makes its phase free

}  // namespace

TEST(TimeModel, FlopsAreSixNTokensPlusAttention) {
  auto r = tiny(1);
  r.zero_stage = 0;
  const auto p = plan::make_plan(r);
  const auto t = plan::predict_step_time(p, 0, flat_profile(1e9, 1e9, kHuge, kHuge));
  // N: the parameters that multiply (every one but the norms' weights; the embedding only through the
  // untied head's copy, i.e. the head's V x h).
  const auto& c = r.model;
  const double h = c.hidden_size, L = c.num_hidden_layers, V = c.vocab_size;
  const double norms = (2 * L + 1) * h;
  const double embedding = c.tie_word_embeddings ? 0 : V * h;  // the input embedding is a lookup
  const double N = static_cast<double>(c.num_parameters()) - norms - embedding;
  const double T = static_cast<double>(r.micro_batch * r.seq_len);
  const double s = r.seq_len, attention = 3 * 4 * r.micro_batch * c.num_attention_heads * s * ((s + 1) / 2) * c.head_dim() * L;
  EXPECT_NEAR(t.model_flops, 6 * N * T + attention, 1e-9 * t.model_flops);
  // At 1 GFLOP/s for products and attention alike and free elementwise work: forward is a third of the
  // FLOPs, backward two thirds (attention's backward counted at its forward FLOPs).
  EXPECT_NEAR(t.forward_s, t.model_flops / 3 / 1e9, 1e-9 * t.forward_s);
  EXPECT_NEAR(t.backward_s, 2 * t.model_flops / 3 / 1e9 - attention / 3 / 1e9, 1e-9 * t.backward_s);
}

TEST(TimeModel, EachPhaseScalesWithItsRate) {
  auto r = tiny(1);
  const auto p = plan::make_plan(r);
  const auto base = plan::predict_step_time(p, 0, flat_profile(1e9, kHuge, kHuge, 1e6));
  const auto faster_gemm = plan::predict_step_time(p, 0, flat_profile(2e9, kHuge, kHuge, 1e6));
  EXPECT_NEAR(faster_gemm.forward_s, base.forward_s / 2, 1e-12);
  EXPECT_NEAR(faster_gemm.backward_s, base.backward_s / 2, 1e-12);
  EXPECT_NEAR(faster_gemm.optimizer_s, base.optimizer_s, 1e-15);
  // The optimizer: one AdamW update per parameter at 1e6 elements/s (stream free).
  EXPECT_NEAR(base.optimizer_s, static_cast<double>(p.rank_parameters) / 1e6, 1e-9);
  const auto slow_stream = plan::predict_step_time(p, 0, flat_profile(kHuge, kHuge, 1e9, kHuge));
  EXPECT_GT(slow_stream.forward_s, 0);
  EXPECT_GT(slow_stream.backward_s, slow_stream.forward_s);  // backward reads and writes more
  EXPECT_DOUBLE_EQ(base.comm_s_total, 0);  // one rank: nothing to communicate
  EXPECT_NEAR(base.step_s, base.forward_s + base.backward_s + base.optimizer_s, 1e-12);
}

TEST(TimeModel, OptimizerPassesOverTheGradientsFollowTheStepsCode) {
  // Free AdamW: what is left is the gradients' passes at 1e9 bytes/s. The norm reads this rank's
  // gradients; clipping reads and writes them; zeroing writes the whole model's at stages 0 and 1 and
  // this rank's shard at 2 and 3 (fp32 gradients, 4 bytes each).
  auto r = tiny(2);
  const auto p = plan::make_plan(r);
  const auto mp = flat_profile(kHuge, kHuge, 1e9, kHuge);
  const double n = static_cast<double>(p.rank_parameters), shard = n / 2;
  EXPECT_NEAR(plan::predict_step_time(p, 0, mp).optimizer_s, (3 * n + n) * 4 / 1e9, 1e-15);
  EXPECT_NEAR(plan::predict_step_time(p, 1, mp).optimizer_s, (3 * shard + n) * 4 / 1e9, 1e-15);
  EXPECT_NEAR(plan::predict_step_time(p, 2, mp).optimizer_s, (3 * shard + shard) * 4 / 1e9, 1e-15);
  r.gradient_clipping = 0;  // no clipping: the norm is still read (it is logged), nothing scaled
  const auto unclipped = plan::make_plan(r);
  EXPECT_NEAR(plan::predict_step_time(unclipped, 1, mp).optimizer_s, (shard + n) * 4 / 1e9, 1e-15);
}

TEST(TimeModel, SixteenBitNormsRunInFp32AndTheLogitsAreCast) {
  // Only elementwise work priced. fp32: per residual-stream element and layer, two RMSNorms of 7
  // four-byte passes and two residual adds of 3; bf16 adds each norm's copy to fp32 and cast back
  // (6 bytes each) but halves its weight product and the adds, so its forward moves more bytes per
  // residual element than fp32's although every tensor it keeps is half the size.
  auto r = tiny(1);
  const auto mp = flat_profile(kHuge, kHuge, 1e9, kHuge);
  const auto fp32 = plan::predict_step_time(plan::make_plan(r), 0, mp);
  r.precision = "bf16";
  const auto bf16 = plan::predict_step_time(plan::make_plan(r), 0, mp);
  const auto& c = r.model;
  const double T = static_cast<double>(r.micro_batch * r.seq_len), h = c.hidden_size, L = c.num_hidden_layers;
  const double V = c.vocab_size, d = c.head_dim(), H = c.num_attention_heads, K = c.num_key_value_heads;
  const double f = c.intermediate_size;
  const auto forward = [&](double norm, double add, double cast) {
    return (L * ((2 * norm + 2 * 3 * add) * T * h + 6 * add * T * (H + K) * d + 5 * add * T * f) + norm * T * h +
            2 * T * V * 4 + cast * T * V) / 1e9;
  };
  EXPECT_NEAR(fp32.forward_s, forward(28, 4, 0), 1e-9 * fp32.forward_s);
  EXPECT_NEAR(bf16.forward_s, forward(6 + 8 + 4 + 8 + 6 + 4, 2, 6), 1e-9 * bf16.forward_s);
}

TEST(TimeModel, TensorParallelRegionsCopyAroundTheirCollectives) {
  // Only elementwise work priced (fp32, 4 bytes). Per layer and direction, two regions: without
  // sequence parallelism each sums a copy of T h (read and written); with it a gather and a
  // reduce-scatter each copy T h / t and T h, while the residual stream's 80 bytes per element (two
  // norms of 28, two adds of 12) run on T h / t elements (the final norm too).
  auto r = tiny(2);
  r.tp = 2;
  r.zero_stage = 0;
  const auto mp = flat_profile(kHuge, kHuge, 1e9, kHuge);
  const auto tp = plan::predict_step_time(plan::make_plan(r), 0, mp);
  r.sequence_parallel = true;
  const auto sp = plan::predict_step_time(plan::make_plan(r), 0, mp);
  const auto& c = r.model;
  const double T = static_cast<double>(r.micro_batch * r.seq_len), h = c.hidden_size, L = c.num_hidden_layers;
  const double tp_copies = 2 * 2 * 4 * T * h, sp_copies = 4 * 2 * 4 * (T * h / 2 + T * h);
  const double forward_saved = (L * 80 + 28) * T * h / 2;
  EXPECT_NEAR(tp.forward_s - sp.forward_s, (forward_saved - L * (sp_copies - tp_copies)) / 1e9, 1e-9 * tp.forward_s);
  EXPECT_NEAR(tp.backward_s - sp.backward_s, (2 * forward_saved - L * (sp_copies - tp_copies)) / 1e9,
              1e-9 * tp.backward_s);
}

TEST(TimeModel, RecomputationAddsTheForwardItRepeats) {
  auto r = tiny(1);
  const auto none = plan::predict_step_time(plan::make_plan(r), 0, flat_profile(1e9, 1e9, kHuge, kHuge));
  r.recompute = "full";
  const auto full = plan::predict_step_time(plan::make_plan(r), 0, flat_profile(1e9, 1e9, kHuge, kHuge));
  // Every decoder layer's forward runs again; the head's does not.
  const auto& c = r.model;
  const double T = static_cast<double>(r.micro_batch * r.seq_len);
  const double head_forward = 2 * T * c.hidden_size * c.vocab_size / 1e9;
  EXPECT_NEAR(full.recompute_s, none.forward_s - head_forward, 1e-9 * none.forward_s);
  EXPECT_NEAR(full.backward_s, none.backward_s + full.recompute_s, 1e-12);
  EXPECT_DOUBLE_EQ(full.model_flops, none.model_flops);  // recomputation is not model work
  EXPECT_DOUBLE_EQ(full.forward_s, none.forward_s);
}

TEST(TimeModel, PipelineWaitsForTheOtherStagesOnceEach) {
  // Two balanced stages (one layer each; a vocabulary of 8 makes the head's work negligible): the
  // bubble is one micro-batch time of the other stage, the fraction (p - 1) / (m + p - 1) of the step.
  auto r = tiny(2);
  r.model.vocab_size = 8;
  r.pp = 2;
  r.accumulation = 4;
  const auto p = plan::make_plan(r);
  const auto mp = flat_profile(1e9, 1e9, kHuge, kHuge);
  const auto t = plan::predict_step_time(p, 0, mp);
  const double compute = t.forward_s + t.backward_s + t.bubble_s;
  EXPECT_NEAR(t.bubble_s / compute, p.pipeline_bubble, 0.01);
  EXPECT_NEAR(p.pipeline_bubble, 1.0 / 5, 1e-12);
  // One stage of two layers does the work of both: twice a stage's forward and backward, no bubble.
  auto whole = r;
  whole.pp = 1;
  whole.devices = 1;
  const auto one = plan::predict_step_time(plan::make_plan(whole), 0, mp);
  EXPECT_DOUBLE_EQ(one.bubble_s, 0);
  EXPECT_NEAR(t.forward_s + t.backward_s, (one.forward_s + one.backward_s) / 2, 0.01 * one.forward_s);
  EXPECT_NEAR(t.bubble_s, (one.forward_s + one.backward_s) / 2 / r.accumulation, 0.01 * t.bubble_s);
}

TEST(TimeModel, OneFOneBWaitsLessThanGPipeOnUnbalancedStages) {
  // Balanced stages: both schedules wait one micro-batch time of the other stage. Stage 0 with three
  // of four layers: GPipe still waits the light stage's whole micro-batch (its forwards all go first),
  // while 1F1B runs the light stage's backward of micro-batch 0 beside the heavy stage's forward of 1.
  auto r = tiny(2);
  r.model.vocab_size = 8;
  r.model.num_hidden_layers = 4;
  r.pp = 2;
  r.accumulation = 2;
  const auto mp = flat_profile(1e9, 1e9, kHuge, kHuge);
  const auto bubble = [&](const std::vector<int64_t>& split, const char* schedule) {
    auto q = r;
    q.pipeline_split = split;
    q.pipeline_schedule = schedule;
    return plan::predict_step_time(plan::make_plan(q), 0, mp).bubble_s;
  };
  EXPECT_NEAR(bubble({2, 2}, "1f1b"), bubble({2, 2}, "gpipe"), 1e-12);
  const double gpipe = bubble({3, 1}, "gpipe"), one_f_one_b = bubble({3, 1}, "1f1b");
  // GPipe: the light stage's one micro-batch, a third of the heavy stage's (one layer against three).
  EXPECT_NEAR(gpipe, bubble({2, 2}, "gpipe") / 2, 0.02 * gpipe);
  EXPECT_LT(one_f_one_b, 0.9 * gpipe);
}

TEST(TimeModel, CollectivesArePricedPerCallAtTheirBandwidth) {
  auto r = tiny(2);
  const auto p = plan::make_plan(r);
  const auto mp = flat_profile(kHuge, kHuge, kHuge, kHuge, 1e9);
  // Stage 0 (fp32 DDP): one all-reduce of the model's fp32 gradients: 2(n-1)/n x bytes / busbw, however
  // it is split into calls (no latency in this profile).
  const auto t0 = plan::predict_step_time(p, 0, mp);
  const double bytes = p.stages[0].comm_bytes.at("all_reduce");
  EXPECT_NEAR(t0.comm_s.at("all_reduce"), bytes * 1.0 / 1e9, 1e-12);
  // Stage 3: gathers twice per micro-step (forward and backward) and reduce-scatters once; the
  // plan counts each all-gather's input (1/n of the buffer), the time model its gathered buffer.
  const auto t3 = plan::predict_step_time(p, 3, mp);
  const auto& c3 = p.stages[3].comm_bytes;
  EXPECT_NEAR(t3.comm_s.at("all_gather"), c3.at("all_gather") * 2 * 0.5 / 1e9, 1e-12);
  EXPECT_NEAR(t3.comm_s.at("reduce_scatter"), c3.at("reduce_scatter") * 0.5 / 1e9, 1e-12);
  // A CPU profile hides nothing; a device profile hides gradient reductions under backward.
  EXPECT_DOUBLE_EQ(t3.comm_exposed_s, t3.comm_s_total);
  auto device = mp;
  device.overlap = 1;
  auto slow_compute = device;
  for (auto& g : slow_compute.gemm) g.flops_per_s = 1e6;
  const auto hidden = plan::predict_step_time(p, 3, slow_compute);
  EXPECT_NEAR(hidden.comm_exposed_s, 0, 1e-12);
}

TEST(TimeModel, CollectiveTimeInterpolatesLogLogWithALatencyFloor) {
  plan::MachineProfile mp = flat_profile(1, 1, 1, 1);
  mp.collectives = {{"all_reduce", 1000, 0, 1e-5}, {"all_reduce", 100000, 0, 1e-4}};
  mp.ranks = 2;
  EXPECT_DOUBLE_EQ(mp.collective_seconds("all_reduce", 10, 2), 1e-5);           // latency floor
  EXPECT_NEAR(mp.collective_seconds("all_reduce", 10000, 2), std::sqrt(1e-5 * 1e-4), 1e-12);  // halfway in log
  EXPECT_NEAR(mp.collective_seconds("all_reduce", 1e6, 2), 1e-3, 1e-12);         // beyond: the last bandwidth
  // On 4 ranks, the bus factor 2(n-1)/n grows from 1 to 1.5.
  EXPECT_NEAR(mp.collective_seconds("all_reduce", 1e6, 4), 1.5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(mp.collective_seconds("all_reduce", 1e6, 1), 0);
  EXPECT_THROW(mp.collective_seconds("reduce_scatter", 10, 2), Error);
}

TEST(MachineProfile, RoundTripsAndRefusesUnknownKeys) {
  const auto mp = flat_profile(3e9, 2e9, 1e10, 5e7);
  const auto back = plan::machine_profile_from_json(plan::to_json(mp));
  EXPECT_EQ(plan::to_json(back), plan::to_json(mp));
  auto j = plan::to_json(mp);
  j["gemm_rate"] = 1;
  try {
    plan::machine_profile_from_json(j);
    FAIL() << "an unknown key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_rate"), std::string::npos);
  }
  j = plan::to_json(mp);
  j["overlap"] = 2;
  EXPECT_THROW(plan::machine_profile_from_json(j), Error);
  EXPECT_THROW(plan::read_machine_profile("/nonexistent/machine.json"), Error);
}

TEST(Search, ListsOnlyFittingLayoutsFastestFirst) {
  auto r = tiny(4, 2, 32);
  r.accumulation = 2;
  const auto mp = flat_profile(1e9, 1e9, 1e10, 1e8, 1e8);
  const auto all = plan::search_layouts(r, &mp);
  EXPECT_EQ(all.global_batch, 2 * 2 * 4);
  ASSERT_GT(all.fitting.size(), 10u);
  EXPECT_EQ(all.fitting.size(), static_cast<size_t>(all.considered));  // no --device-memory: every layout fits
  for (size_t i = 1; i < all.fitting.size(); ++i) EXPECT_LE(all.fitting[i - 1].time.step_s, all.fitting[i].time.step_s);
  for (const auto& c : all.fitting)
    EXPECT_EQ(c.request.micro_batch * c.request.accumulation * c.dp, all.global_batch);
  // With a memory limit between the smallest and the largest layout, only those under it are listed.
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& c : all.fitting) lo = std::min(lo, c.bytes), hi = std::max(hi, c.bytes);
  r.device_memory = static_cast<double>(lo + hi) / 2;
  const auto some = plan::search_layouts(r, &mp);
  ASSERT_FALSE(some.fitting.empty());
  EXPECT_LT(some.fitting.size(), all.fitting.size());
  for (const auto& c : some.fitting) EXPECT_LE(c.bytes, r.device_memory);
  // Without a profile: layouts without offload first (this profile has no disk: it listed none), then
  // smallest first.
  const auto by_bytes = plan::search_layouts(r, nullptr);
  for (size_t i = 1; i < by_bytes.fitting.size(); ++i) {
    const auto &a = by_bytes.fitting[i - 1], &b = by_bytes.fitting[i];
    EXPECT_LE(a.disk > 0, b.disk > 0);
    if ((a.disk > 0) == (b.disk > 0)) EXPECT_LE(a.bytes, b.bytes);
  }
}

TEST(Search, ListsHybridShardingAtShardedStagesWithItsBytes) {
  // 4 data-parallel ranks: ZeRO over all 4, and hybrid sharding in groups of 2 (the only proper
  // divisor > 1), the latter at stages 1-3 only. A shard group of 2 holds more than ZeRO over 4 at
  // the same stage (each rank's shard is twice as large); the emitted config turns it on.
  auto r = tiny(4, 1, 32);
  const auto mp = flat_profile(1e9, 1e9, 1e10, 1e8, 1e8);
  const auto found = plan::search_layouts(r, &mp);
  std::map<std::pair<int, int>, int64_t> bytes;  // (zero stage, shard) -> bytes, at mb=1 recompute none
  const auto at = [&](int stage, int shard) { return bytes.at(std::make_pair(stage, shard)); };
  for (const auto& c : found.fitting) {
    const auto& q = c.request;
    if (c.dp != 4 || q.micro_batch != 1 || q.recompute != "none") continue;
    EXPECT_TRUE(q.shard == 0 || q.shard == 2) << q.shard;
    if (q.shard > 0) {
      EXPECT_GE(q.zero_stage, 1);
    }
    bytes[{q.zero_stage, q.shard}] = c.bytes;
  }
  for (int stage = 1; stage <= 3; ++stage) {
    ASSERT_TRUE(bytes.count(std::make_pair(stage, 2))) << "stage " << stage;
    EXPECT_GT(at(stage, 2), at(stage, 0)) << "stage " << stage;
  }
  EXPECT_FALSE(bytes.count(std::make_pair(0, 2)));
  for (const auto& c : found.fitting)
    if (c.request.shard == 2 && c.request.zero_stage == 3) {
      auto p = plan::make_plan(c.request);
      p.recommended_stage = 3;
      const auto cfg = plan::recommended_config(p);
      EXPECT_EQ(cfg["parallelism"]["hybrid_shard"], true);
      EXPECT_EQ(cfg["parallelism"]["shard_group_size"], 2);
      break;
    }
}

TEST(Planner, RecommendsRecomputationOnlyWhereNothingFitsWithout) {
  // Issue 26's example: llama-7b on 8 devices of 80 GB. ZeRO-2 without recomputation fits with room
  // to spare, so recomputing every layer (a third more compute) is not recommended.
  plan::PlanRequest r;
  r.model = model::preset("llama-7b");
  r.model_name = "llama-7b";
  r.devices = 8;
  r.seq_len = 2048;
  r.device_memory = plan::parse_bytes("80GB");
  const auto p = plan::make_plan(r);
  EXPECT_EQ(p.recommended_stage, 2);
  EXPECT_EQ(p.recommended_recompute, "none");
  for (const auto& s : p.stages)
    if (s.stage == 2) EXPECT_TRUE(s.fits);
}

TEST(Planner, MixtureOfExpertsIsPlannedAsTheTrainerRunsIt) {
  using shardlm::test_support::error_of;
  // parallelize() runs MoE models under tensor parallelism (attention split, the sparse block
  // replicated) and pipeline stages, except the load-balancing loss across stages or sequence
  // shards: the planner refuses what the trainer refuses, and --search lists no such layout.
  plan::PlanRequest r;
  r.model = model::read_hf_config(SHARDLM_SOURCE_DIR "/tests/data/hf_configs/mixtral-8x7b-v0.1.json");
  r.model_name = "mixtral";
  r.seq_len = 2048;
  r.devices = 8;
  r.tp = 2;
  const auto tp2 = plan::make_plan(r);
  // The experts (and router) are replicated over tp: each rank holds more than half of the model.
  EXPECT_GT(tp2.rank_parameters, tp2.parameters / 2);
  EXPECT_LT(tp2.rank_parameters, tp2.parameters);
  r.tp = 1;
  r.pp = 2;
  EXPECT_NO_THROW(plan::make_plan(r));
  // The load-balancing loss's sums travel between stages and are summed over sequence shards.
  r.model.output_router_logits = true;
  EXPECT_NO_THROW(plan::make_plan(r));
  r.pp = 1;
  r.tp = 2;
  r.sequence_parallel = true;
  EXPECT_NO_THROW(plan::make_plan(r));
  r.model.moe_capacity_factor = 1.0;  // still refused: the capacity would count one shard's tokens
  const auto shards = error_of([&] { plan::make_plan(r); });
  EXPECT_NE(shards.find("model.moe_capacity_factor = 1 with parallelism.sequence_parallel"), std::string::npos) << shards;
  r.model.moe_capacity_factor = 0;
  r.model.output_router_logits = false;
  r.tp = 1;
  r.sequence_parallel = false;
  r.devices = 64;
  r.device_memory = plan::parse_bytes("80GB");
  const auto p = plan::make_plan(r);
  EXPECT_EQ(p.recommended_stage, 3);
  EXPECT_EQ(p.recommended_tp, 1);  // tensor parallelism would replicate the experts
  EXPECT_EQ(p.recommended_pp, 1);
  auto tiny_moe = tiny(4);
  tiny_moe.model.model_type = "mixtral";
  tiny_moe.model.num_experts = 4;
  tiny_moe.model.num_experts_per_tok = 2;
  const auto mp = flat_profile(1e9, 1e9, 1e10, 1e8);
  const auto found = plan::search_layouts(tiny_moe, &mp);
  ASSERT_FALSE(found.fitting.empty());
  bool split = false;
  for (const auto& c : found.fitting) split = split || c.request.pp > 1;
  EXPECT_TRUE(split) << "pipeline stages run MoE models";
  tiny_moe.model.output_router_logits = true;  // the load-balancing loss too
  split = false;
  for (const auto& c : plan::search_layouts(tiny_moe, &mp).fitting) split = split || c.request.pp > 1;
  EXPECT_TRUE(split) << "pipeline stages run MoE models with the load-balancing loss";
}
