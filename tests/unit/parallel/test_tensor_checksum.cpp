// The consistency checks' checksum is exact: equal bytes (same dtype and shape) give equal sums, a
// one-ulp change, a sign of zero, another dtype or shape give different ones.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/consistency.h"

using namespace shardlm;

TEST(TensorChecksum, ExactOverBytesDtypeAndShape) {
  const auto a = at::randn({37, 5}, at::kFloat);
  EXPECT_EQ(parallel::tensor_checksum(a), parallel::tensor_checksum(a.clone()));
  EXPECT_EQ(parallel::tensor_checksum(a.t().contiguous().t()), parallel::tensor_checksum(a));  // layout is not content
  for (int64_t i : {0L, 93L, 184L}) {  // the first element, the middle, the 4-byte tail past the last 8-byte word
    auto b = a.clone();
    auto e = b.view({-1}).narrow(0, i, 1);
    e.copy_(at::nextafter(e, at::full_like(e, INFINITY)));
    EXPECT_NE(parallel::tensor_checksum(b), parallel::tensor_checksum(a)) << "element " << i;
  }
  EXPECT_NE(parallel::tensor_checksum(at::zeros({4})), parallel::tensor_checksum(-at::zeros({4})));
  EXPECT_NE(parallel::tensor_checksum(at::zeros({4})), parallel::tensor_checksum(at::zeros({2, 2})));
  EXPECT_NE(parallel::tensor_checksum(at::zeros({4}, at::kInt)), parallel::tensor_checksum(at::zeros({4}, at::kFloat)));
}
