// The planner under context parallelism (plan --cp): each rank's activations are those of its
// seq_len / cp positions plus the whole sequence's keys and values each layer keeps for backward (the
// ring's blocks), the model states shard over the dp x cp ranks as the trainer's ZeRO does, the K/V
// exchange's bytes per mode, and plan --search's cp candidates.
#include <gtest/gtest.h>

#include "model/llama_config.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/time_model.h"

using namespace shardlm;

namespace {
plan::PlanRequest request(int devices, int cp, int64_t seq_len) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model.max_position_embeddings = 4096;
  r.model_name = "tiny";
  r.devices = devices;
  r.cp = cp;
  r.seq_len = seq_len;
  r.zero_stage = 3;
  r.precision = "fp32";
  return r;
}
}  // namespace

TEST(ContextPlan, ActivationsAreARanksPositionsPlusTheOtherRanksKeysAndValues) {
  const auto whole = plan::make_plan(request(4, 1, 2048)).stages[0].memory;
  const auto quarter = plan::make_plan(request(4, 1, 512)).stages[0].memory;
  const auto cp4 = plan::make_plan(request(4, 4, 2048)).stages[0].memory;
  const auto& cfg = model::preset("tiny");
  // K and V of all 2048 positions (the ring keeps every block it saw, its own K/V stacked into the
  // first message), fp32, every layer (1 sequence).
  const int64_t kv = 2048 * 2 * cfg.num_key_value_heads * cfg.head_dim() * 4 * cfg.num_hidden_layers;
  EXPECT_EQ(cp4.activations, quarter.activations + kv);
  EXPECT_LT(cp4.activations, whole.activations / 2);
  EXPECT_EQ(cp4.model_states(), whole.model_states());  // ZeRO-3 over the same 4 ranks
}

// Full recomputation keeps no exchanged K/V (each layer's ring runs again in backward); all_gather
// keeps the gathered K/V and the bool mask of this rank's queries against every key.
TEST(ContextPlan, KeptKeysAndValuesFollowTheModeAndRecomputation) {
  auto full = request(4, 4, 2048), gather = request(4, 4, 2048), quarter = request(4, 1, 512);
  full.recompute = quarter.recompute = "full";
  gather.cp_mode = "all_gather";
  EXPECT_EQ(plan::make_plan(full).stages[0].memory.activations, plan::make_plan(quarter).stages[0].memory.activations);
  const auto ring = plan::make_plan(request(4, 4, 2048)).stages[0].memory.activations;
  EXPECT_EQ(plan::make_plan(gather).stages[0].memory.activations, ring + 512 * 2048 * model::preset("tiny").num_hidden_layers);
}

// Bytes per step per rank as the trainer counts them (each call's input), tiny: 2 layers, 2 KV heads of
// 16, fp32, one sequence of 2048 at cp 4 (t = 512 positions per rank).
TEST(ContextPlan, KeyValueExchangeBytesPerMode) {
  const double block = 2.0 * 512 * 2 * 16 * 4;  // [2, B, KV, t, D] fp32
  auto r = request(4, 4, 2048);
  EXPECT_EQ(plan::make_plan(r).stages[0].comm_bytes.at("cp_p2p"), 2 * 3 * block * 2);  // 3 hops, forward + backward
  r.recompute = "selective";  // the core's forward runs again
  EXPECT_EQ(plan::make_plan(r).stages[0].comm_bytes.at("cp_p2p"), 2 * 3 * block * 3);
  r = request(4, 4, 2048);
  r.cp_mode = "all_gather";
  const auto g = plan::make_plan(r).stages[0].comm_bytes;
  EXPECT_EQ(g.at("cp_all_gather"), 2 * block);  // K and V of 512 positions, each layer
  EXPECT_EQ(g.at("cp_reduce_scatter"), 2 * block * 4);  // their gradients over all 2048
  r.cp_mode = "all_to_all";  // 4 heads of 16 to the head split: q, k and v repeated (2 KV heads, cp 4), out
  EXPECT_EQ(plan::make_plan(r).stages[0].comm_bytes.at("cp_all_to_all"), 2 * 4 * 512 * 64 * 4 * 2.0);
}

// plan --search tries every cp that divides the ranks and splits the sequence into 2 cp chunks: 36
// positions split in 4 chunks (cp 2) but not in 8 (cp 4).
TEST(ContextPlan, SearchTriesContextParallelSizesThatSplitTheSequence) {
  auto r = request(4, 1, 36);
  r.zero_stage = -1;
  const auto s = plan::search_layouts(r, nullptr);
  bool cp2 = false;
  for (const auto& c : s.fitting) {
    EXPECT_NE(c.request.cp, 4);
    EXPECT_TRUE(c.request.cp == 1 || c.request.micro_batch == 1);
    cp2 = cp2 || c.request.cp == 2;
  }
  EXPECT_TRUE(cp2);
  r.seq_len = 64;
  bool cp4 = false;
  for (const auto& c : plan::search_layouts(r, nullptr).fitting) cp4 = cp4 || c.request.cp == 4;
  EXPECT_TRUE(cp4);
}

TEST(ContextPlan, RefusesWhatDoesNotSplit) {
  EXPECT_THROW(plan::make_plan(request(4, 3, 2048)), std::exception);  // 3 does not divide 4 ranks
  EXPECT_THROW(plan::make_plan(request(4, 4, 2044)), std::exception);  // 2044 is not a multiple of 8
}

// The time model prices a rank's own positions: at cp 2 each rank's forward is half of one rank's
// over the whole sequence (products over half the tokens, half of the causal pairs of attention), and
// the job's tokens per second count each sequence once.
TEST(ContextPlan, TimeModelPricesARanksPositions) {
  plan::MachineProfile mp;
  for (const char* dt : {"fp32", "bf16"}) {
    mp.gemm.push_back({dt, 64, 64, 64, 1e9});
    mp.attention_forward[dt] = mp.attention_backward[dt] = 1e9;
  }
  mp.stream_bytes_per_s = 1e9;
  mp.optimizer_elements_per_s = 1e9;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p"})
    mp.collectives.push_back({op, 1 << 20, 1e9, 1e-3});
  auto one = request(2, 1, 256), two = request(2, 2, 256);
  one.devices = 1;
  const auto a = plan::predict_step_time(plan::make_plan(one), 3, mp);
  const auto b = plan::predict_step_time(plan::make_plan(two), 3, mp);
  EXPECT_NEAR(b.forward_s, a.forward_s / 2, 1e-9 * a.forward_s);
  EXPECT_NEAR(b.model_flops, a.model_flops / 2, 1e-9 * a.model_flops);
  EXPECT_NEAR(b.tokens_per_s, 256 * 1.0 / b.step_s, 1e-9 * b.tokens_per_s);
  // The ring's hops: (cp - 1) x layers messages forward and as many backward, of one block each.
  ASSERT_EQ(b.comm_s.count("cp_p2p"), 1u);
  const double block = 2.0 * 128 * 2 * 16 * 4;
  EXPECT_NEAR(b.comm_s.at("cp_p2p"), 2 * 2 * mp.collective_seconds("p2p", block, 2), 1e-12);
}
