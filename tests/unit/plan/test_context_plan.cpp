// The planner under context parallelism (plan --cp): each rank's activations are those of its
// seq_len / cp positions plus the other ranks' keys and values each layer keeps for backward, and the
// model states shard over the dp x cp ranks as the trainer's ZeRO does.
#include <gtest/gtest.h>

#include "model/llama_config.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
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
  // K and V of the 1536 positions the other 3 ranks hold, fp32, every layer (1 sequence).
  const int64_t kv = 1536 * 2 * cfg.num_key_value_heads * cfg.head_dim() * 4 * cfg.num_hidden_layers;
  EXPECT_EQ(cp4.activations, quarter.activations + kv);
  EXPECT_LT(cp4.activations, whole.activations / 2);
  EXPECT_EQ(cp4.model_states(), whole.model_states());  // ZeRO-3 over the same 4 ranks
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
}
