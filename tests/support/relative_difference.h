// The tests' norm-wise relative difference |a - b| / |b|, computed in double whatever the tensors'
// dtype (so an fp32 comparison is not rounded twice) and NaN when either side holds a NaN, so that the
// EXPECT_LE(d, bound) after it fails. Shared by every test binary, included by relative path.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>

namespace shardlm::test_support {

inline double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return (a64 - b64).norm().item<double>() / std::max(b64.norm().item<double>(), 1e-300);
}

}  // namespace shardlm::test_support
