// The planner under context parallelism (plan --cp): each rank's activations are those of its
// seq_len / cp positions plus the other ranks' keys and values each layer keeps for backward, and the
// model states shard over the dp x cp ranks as the trainer's ZeRO does.
#include <gtest/gtest.h>

#include "model/llama_config.h"
#include "plan/planner.h"

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
