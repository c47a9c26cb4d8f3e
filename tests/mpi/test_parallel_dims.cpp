// ParallelDims, the one topology object: dp x tp x pp must equal the world size, dp = 0 takes what
// is left, every sub-communicator has the size and rank order the layout promises (tp innermost,
// then dp, then pp), and a bad layout is refused with a message naming the arithmetic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"
#include "parallel/parallel_dims.h"

using namespace shardlm;

namespace {
std::string error_of(int dp, int tp, int pp) {
  try {
    parallel::ParallelDims::build(comm::mpi_world(), dp, tp, pp);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ParallelDims, DataParallelTakesTheWholeWorld) {
  auto world = comm::mpi_world();
  const int n = world->size();
  for (int dp : {0, n}) {
    const auto d = parallel::ParallelDims::build(world, dp, 1, 1);
    EXPECT_EQ(d.dp, n);
    EXPECT_EQ(d.tp, 1);
    EXPECT_EQ(d.pp, 1);
    EXPECT_EQ(d.dp_comm->size(), n);
    EXPECT_EQ(d.dp_rank(), world->rank());
    EXPECT_EQ(d.tp_comm->size(), 1);
    EXPECT_EQ(d.pp_comm->size(), 1);
    EXPECT_EQ(d.is_logging_rank(), world->rank() == 0);
    // The dp group really connects every rank: the sum of ranks arrives everywhere.
    auto t = at::tensor({static_cast<double>(world->rank())}, at::kDouble);
    d.dp_comm->all_reduce(t);
    EXPECT_EQ(t.item<double>(), n * (n - 1) / 2.0);
  }
}

TEST(ParallelDims, RefusesLayoutsThatDoNotMultiplyToTheWorld) {
  const int n = comm::mpi_world()->size();
  const std::string wrong = error_of(n + 1, 1, 1);
  EXPECT_NE(wrong.find("dp x tp x pp = " + std::to_string(n + 1) + " x 1 x 1"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("the job has " + std::to_string(n) + " ranks"), std::string::npos) << wrong;
  EXPECT_NE(error_of(0, 3, 1).find("not divisible by tp x pp = 3 x 1"), std::string::npos) << error_of(0, 3, 1);
  EXPECT_NE(error_of(1, 0, 1).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of(0, 1, -1).find("must be positive"), std::string::npos);
}

// Pipeline groups: ranks with the same (dp, tp) position, ordered by stage (pp outermost).
TEST(ParallelDims, PipelineGroupsAreTheOutermostAxis) {
  auto world = comm::mpi_world();
  const int n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const auto d = parallel::ParallelDims::build(world, 0, 1, 2);
  EXPECT_EQ(d.dp, n / 2);
  EXPECT_EQ(d.pp_comm->size(), 2);
  EXPECT_EQ(d.pp_comm->rank(), world->rank() / (n / 2));
  auto t = at::tensor({static_cast<double>(world->rank())}, at::kDouble);
  d.pp_comm->all_reduce(t);
  EXPECT_EQ(t.item<double>(), 2 * (world->rank() % (n / 2)) + n / 2);
}

// Rank order tp innermost: tensor-parallel peers are adjacent ranks, and each tp position has its
// own data-parallel group.
TEST(ParallelDims, TensorParallelGroupsAreAdjacentRanks) {
  auto world = comm::mpi_world();
  const int n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const auto d = parallel::ParallelDims::build(world, 0, 2, 1);
  EXPECT_EQ(d.dp, n / 2);
  EXPECT_EQ(d.tp_comm->size(), 2);
  EXPECT_EQ(d.tp_comm->rank(), world->rank() % 2);
  EXPECT_EQ(d.dp_comm->size(), n / 2);
  EXPECT_EQ(d.dp_rank(), world->rank() / 2);
  auto t = at::tensor({static_cast<double>(world->rank())}, at::kDouble);
  d.tp_comm->all_reduce(t);
  const int first = world->rank() / 2 * 2;
  EXPECT_EQ(t.item<double>(), first + first + 1);
}

// Context parallelism sits between tp and dp (tp, cp, dp, pp innermost first): with tp 2 x cp 2 the
// cp peers of world rank r are r and r ± 2, they join dp_comm (dp x cp ranks average the gradients),
// and the data loader reads as dp / cp ranks.
TEST(ParallelDims, ContextParallelGroupsSitBetweenTensorAndDataParallel) {
  auto world = comm::mpi_world();
  const int n = world->size(), r = world->rank();
  if (n % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  const auto d = parallel::ParallelDims::build(world, 0, 2, 1, 0, 1, 2);
  EXPECT_EQ(d.cp, 2);
  EXPECT_EQ(d.dp, n / 2);  // dp x cp
  EXPECT_EQ(d.data_ranks(), n / 4);
  EXPECT_EQ(d.data_rank(), r / 4);
  EXPECT_EQ(d.cp_rank(), (r / 2) % 2);
  auto t = at::tensor({static_cast<double>(r)}, at::kDouble);
  d.cp_comm->all_reduce(t);
  const int first = r / 4 * 4 + r % 2;
  EXPECT_EQ(t.item<double>(), first + first + 2);
  EXPECT_THROW(parallel::ParallelDims::build(world, 0, 1, 1, 0, 1, 3 * n), std::exception);
}
