// The planner's optimizer-state bytes with compact states (optimizer.state_precision): the counts
// derived by hand for the tiny preset, the same as an AdamW built on that model's tensors holds, and
// the per-rank maximum under ZeRO. (tests/mpi/test_compact_states.cpp checks memory.json against it.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_memory.h"
#include "plan/planner.h"

using namespace shardlm;

// tiny: embed 128x64 = 8192; per layer q 4096, k 2048, v 2048, o 4096, gate/up/down 11264 each,
// two norms 64; final norm 64; head 8192 (108864 parameters).
// 8-bit (min_8bit_size 4096): a parameter of n >= 4096 elements holds 2n + 8·ceil(n/256) bytes
// (codes + two fp32 absmax per 256-element block), a smaller one 8n (fp32 moments):
//   embed, head: 16384 + 256 = 16640;  q, o: 8192 + 128 = 8320;  k, v: 16384;
//   gate/up/down: 22528 + 352 = 22880;  norms: 512
//   per layer 2·8320 + 2·16384 + 3·22880 + 2·512 = 119072;  total 2·16640 + 2·119072 + 512 = 271936.
TEST(CompactStateBytes, EightBitStageZeroIsTheHandCountAndWhatAdamWHolds) {
  const auto cfg = model::preset("tiny");
  const auto fp32 = plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5);
  const auto bf16 = plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 1, "bf16");
  const auto q8 = plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 1, "8bit");
  EXPECT_EQ(fp32.optimizer_states, 8 * 108864);
  EXPECT_EQ(bf16.optimizer_states, 4 * 108864);
  EXPECT_EQ(q8.optimizer_states, 271936);
  EXPECT_EQ(q8.compute_params, fp32.compute_params);  // only the moments change
  // min_8bit_size 2048 takes k and v to 8 bits too: 2 layers x 2 x (16384 - (4096 + 64)).
  EXPECT_EQ(plan::model_state_bytes(cfg, 0, 1, "fp32", "fp32", 1e5, 1, "8bit", 2048).optimizer_states,
            271936 - 4 * (16384 - 4160));

  // An AdamW over tensors of the model's shapes (whole parameters, as DDP hands them) holds that.
  std::vector<at::Tensor> keep;
  std::vector<optim::Segment> segments;
  for (const auto& [name, shape] : model::describe(cfg).params) {
    keep.push_back(at::zeros(shape));
    keep.push_back(at::zeros(shape));
    segments.push_back({name, keep[keep.size() - 2], keep.back(), shape.size() >= 2});
  }
  optim::AdamWOptions o;
  o.state_precision = optim::StatePrecision::Int8;
  EXPECT_EQ(optim::AdamW(segments, o).state_bytes(), q8.optimizer_states);
  o.state_precision = optim::StatePrecision::BF16;
  EXPECT_EQ(optim::AdamW(segments, o).state_bytes(), bf16.optimizer_states);
}

// Under ZeRO the 8-bit bytes depend on where shards cut parameters and blocks; the formula is the
// most any rank holds, and every rank's own count is at most that, their sum the whole model's
// count plus the absmax values of cut blocks (counted on both sides).
TEST(CompactStateBytes, EightBitUnderZeroIsTheLargestRank) {
  const auto cfg = model::preset("tiny");
  parallel::ZeroBytes b;
  b.states = optim::StatePrecision::Int8;
  for (int dp : {2, 3, 5}) {
    const auto layout = parallel::FlatLayout::build(model::describe(cfg), dp);
    int64_t most = 0, sum = 0;
    for (int r = 0; r < dp; ++r) {
      const int64_t bytes = parallel::optimizer_state_bytes(layout, b, r);
      most = std::max(most, bytes);
      sum += bytes;
    }
    EXPECT_EQ(plan::model_state_bytes(cfg, 2, dp, "fp32", "fp32", 1e5, 1, "8bit").optimizer_states, most) << dp;
    EXPECT_GE(sum, 271936) << dp;
    EXPECT_LE(sum, 271936 + 8 * 2 * (dp - 1) * static_cast<int64_t>(layout.units.size())) << dp;
    EXPECT_LE(most, 271936 / dp + 271936 / 5) << dp << ": roughly an even share";
  }
}
