// The tests' worst-deviation helpers fail on NaN: a parity comparison whose run produced a NaN loss or
// NaN weights must fail its bound, where folding with std::max kept the previous deviation and passed.
#include <ATen/ATen.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../../mpi/trajectory.h"
#include "../../support/worst_of.h"

using namespace shardlm;
using test_support::worst_of;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

test_support::Outcome outcome(double step2_loss, double weight) {
  test_support::Outcome o;
  for (double loss : {2.0, step2_loss}) {
    observe::StepMetrics m;
    m.step = static_cast<int64_t>(o.history.size()) + 1;
    m.loss = loss;
    m.grad_norm = 1.0;
    o.history.push_back(m);
  }
  o.weights.emplace_back("w", at::full({3}, weight, at::kDouble));
  return o;
}

}  // namespace

TEST(WorstOf, IsNanWhenEitherSideIsNan) {
  EXPECT_EQ(std::max(1e-13, kNaN), 1e-13);  // what the tests folded with before
  EXPECT_TRUE(std::isnan(worst_of(1e-13, kNaN)));
  EXPECT_TRUE(std::isnan(worst_of(kNaN, 1e-13)));
  EXPECT_TRUE(std::isnan(worst_of({0.0, kNaN, 1.0})));
  EXPECT_EQ(worst_of(1e-13, 2e-13), 2e-13);
  EXPECT_EQ(worst_of({3.0, 1.0, 2.0}), 3.0);
}

// trajectory.h's deviation_of, as the model-parallel and expert-parallel suites use it: a run whose
// second step's loss is NaN, or whose weights are NaN, now fails a 1e-12 bound.
TEST(WorstOf, ParityWithNanLossOrWeightsFails) {
  const auto ref = outcome(1.5, 0.25);
  const auto same = test_support::deviation_of(outcome(1.5, 0.25), ref);
  EXPECT_LE(same.loss, 1e-12);
  EXPECT_LE(same.weights, 1e-12);
  const auto nan_loss = test_support::deviation_of(outcome(kNaN, 0.25), ref);
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(nan_loss.loss, 1e-12), "nan_loss.loss");
  const auto nan_weights = test_support::deviation_of(outcome(1.5, kNaN), ref);
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(nan_weights.weights, 1e-12), "nan_weights.weights");
}
