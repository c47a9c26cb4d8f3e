// comm/all_to_all.h without peers: the element counts and offsets a backend hands its library for
// per-rank row counts, and the local refusals (each names the argument and the fix) that every
// backend and the checking decorator share.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/all_to_all.h"
#include "util/error.h"
#include "../../support/error_of.h"

using namespace shardlm;

namespace {
using shardlm::test_support::error_of;
}  // namespace

TEST(AllToAllSplit, RowsBecomeElementCountsAndOffsetsInRankOrder) {
  // Rank 1 of 3, rows of 2 x 3 = 6 elements: sends 2, 0, 3 rows; receives 1, 0, 4 rows.
  const auto in = at::zeros({5, 2, 3}, at::kFloat), out = at::zeros({5, 2, 3}, at::kFloat);
  const auto s = comm::check_all_to_all("ep", 1, 3, in, out, {2, 0, 3}, {1, 0, 4});
  EXPECT_EQ(s.row_elements, 6);
  EXPECT_EQ(s.send_elements, (std::vector<int64_t>{12, 0, 18}));
  EXPECT_EQ(s.send_offsets, (std::vector<int64_t>{0, 12, 12}));
  EXPECT_EQ(s.recv_elements, (std::vector<int64_t>{6, 0, 24}));
  EXPECT_EQ(s.recv_offsets, (std::vector<int64_t>{0, 6, 6}));
  // Nothing at all to exchange is a valid call.
  const auto empty = comm::check_all_to_all("ep", 0, 2, at::zeros({0, 4}), at::zeros({0, 4}), {0, 0}, {0, 0});
  EXPECT_EQ(empty.send_elements, (std::vector<int64_t>{0, 0}));
}

TEST(AllToAllSplit, BadArgumentsAreRefusedWithTheirNames) {
  const auto in = at::zeros({4, 2}, at::kFloat), out = at::zeros({4, 2}, at::kFloat);
  auto check = [&](const at::Tensor& i, const at::Tensor& o, std::vector<int64_t> s, std::vector<int64_t> r) {
    return error_of([&] { comm::check_all_to_all("ep", 0, 2, i, o, s, r); });
  };
  EXPECT_NE(check(in, out, {4}, {2, 2}).find("send_counts has 1 entries [4]; it needs one per rank (2)"),
            std::string::npos);
  EXPECT_NE(check(in, out, {1, 2}, {2, 2}).find("send_counts [1, 2] add up to 3 rows, but input has 4 rows"),
            std::string::npos);
  EXPECT_NE(check(in, out, {2, 2}, {-1, 5}).find("recv_counts[0] is -1"), std::string::npos);
  EXPECT_NE(check(in, out, {1, 3}, {2, 2}).find("rank 0 sends itself 1 rows (send_counts[0]) but expects 2"),
            std::string::npos);
  EXPECT_NE(check(in, at::zeros({4, 3}), {2, 2}, {2, 2}).find("of input holds 2 elements, of output 3"),
            std::string::npos);
  EXPECT_NE(check(in, out.to(at::kDouble), {2, 2}, {2, 2}).find("input is Float but output is Double"),
            std::string::npos);
  EXPECT_NE(check(at::zeros({}), out, {0, 0}, {2, 2}).find("need at least one dimension"), std::string::npos);
  EXPECT_NE(check(at::zeros({2, 4}).t(), out, {2, 2}, {2, 2}).find("contiguous"), std::string::npos);
  EXPECT_NE(check(in, in, {2, 2}, {2, 2}).find("overlap"), std::string::npos);
  EXPECT_EQ(check(in, out, {2, 2}, {2, 2}), "(no error)");
}
