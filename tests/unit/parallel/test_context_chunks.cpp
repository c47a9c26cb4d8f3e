// Context parallelism's split and masks (parallel/context/chunks.h): rank i holds chunks i and
// 2c-1-i, every rank meets the same number of (query, key) pairs under the causal mask, and a
// rank's queries attending over every rank's keys with the masks computed from their places in the
// sequence give exactly the rows of one process's attention (causal, sliding windows, packed samples).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/attention.h"
#include "parallel/context/chunks.h"

using namespace shardlm;
using namespace shardlm::parallel::context;

namespace {
std::vector<int64_t> values(const at::Tensor& t) {
  const auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}
}  // namespace

TEST(ContextChunks, RankHoldsChunkIAndItsMirror) {
  EXPECT_EQ(values(chunk_positions(16, 2, 0)), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(values(chunk_positions(16, 2, 1)), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(values(chunk_positions(16, 4, 3)), (std::vector<int64_t>{6, 7, 8, 9}));
  EXPECT_THROW(chunk_positions(12, 4, 0), std::exception);  // 12 does not split into 8 chunks
}

TEST(ContextChunks, SplitTakesThePositionsChunksName) {
  const auto x = at::arange(2 * 24, at::kLong).view({2, 24});
  for (int c : {2, 3}) {
    std::vector<int64_t> seen;
    for (int r = 0; r < c; ++r) {
      const auto part = split_sequence(x, c, r);
      EXPECT_TRUE(at::equal(part[0], chunk_positions(24, c, r))) << "c " << c << " rank " << r;
      EXPECT_TRUE(at::equal(part[1], chunk_positions(24, c, r) + 24));
    }
    EXPECT_TRUE(at::equal(std::get<0>(at::sort(gathered_positions(24, c))), at::arange(24, at::kLong)));
  }
}

TEST(ContextChunks, EveryRankMeetsTheSameNumberOfCausalPairs) {
  for (int c : {2, 4}) {
    const int64_t T = 64;
    const auto keys = at::arange(T, at::kLong);
    for (int r = 0; r < c; ++r) {
      const auto visible = blocked_between(chunk_positions(T, c, r), keys, 0).logical_not().sum().item<int64_t>();
      EXPECT_EQ(visible, T * (T + 1) / 2 / c) << "c " << c << " rank " << r;
    }
  }
}

TEST(ContextChunks, MasksFromPlacesEqualOneProcessAttention) {
  const int64_t B = 2, H = 4, KV = 2, T = 24, D = 8;
  at::manual_seed(43);
  const auto opt = at::TensorOptions(at::kDouble);
  const auto q = at::randn({B, H, T, D}, opt), k = at::randn({B, KV, T, D}, opt), v = at::randn({B, KV, T, D}, opt);
  // Packed rows whose samples start at 0, 5, 18 (row 0) and 0, 11 (row 1).
  auto segments = at::zeros({B, T}, at::kLong);
  segments[0].narrow(0, 5, 13).fill_(1);
  segments[0].narrow(0, 18, 6).fill_(2);
  segments[1].narrow(0, 11, 13).fill_(1);
  for (int64_t window : {0, 3, 7, 30})
    for (bool packed : {false, true})
      for (auto impl : {model::Attention::Eager, model::Attention::Sdpa}) {
        const auto seg = packed ? segments : at::Tensor();
        const auto one = model::causal_attention(q, k, v, impl, window, seg);
        for (int c : {2, 3}) {
          const auto all = gathered_positions(T, c);
          const auto k_all = k.index_select(2, all), v_all = v.index_select(2, all);
          const auto seg_all = packed ? segments.index_select(1, all) : at::Tensor();
          for (int r = 0; r < c; ++r) {
            const auto mine = chunk_positions(T, c, r);
            const auto blocked = blocked_between(mine, all, window, packed ? segments.index_select(1, mine) : at::Tensor(), seg_all);
            const auto got = model::masked_attention(q.index_select(2, mine), k_all, v_all, impl, blocked);
            const double err = (got - one.index_select(2, mine)).abs().max().item<double>();
            EXPECT_TRUE(err < 1e-13) << "window " << window << " packed " << packed << " c " << c << " rank " << r
                                     << ": " << err;  // fails on NaN too
          }
        }
      }
}
