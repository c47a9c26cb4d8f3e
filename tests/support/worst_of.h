// The one "largest deviation so far" of the tests. std::max(d, NaN) keeps d, so a NaN loss, norm or
// weight folded into a worst deviation with std::max passes every bound as if it matched; worst_of
// is NaN as soon as either side is NaN, and the EXPECT_LE(worst, bound) that follows fails. Shared by
// every test binary (unit layers, MPI suites, SFT parity), included by relative path.
#pragma once
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace shardlm::test_support {

inline double worst_of(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

inline double worst_of(std::initializer_list<double> deviations) {
  double w = -std::numeric_limits<double>::infinity();
  for (double d : deviations) w = worst_of(w, d);
  return w;
}

}  // namespace shardlm::test_support
