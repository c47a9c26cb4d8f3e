// gtest main for tests that run inside `mpirun -n N`: initialises MPI, lets only rank 0 print
// results, and makes the exit code reflect a failure on any rank. With SHARDLM_TEST_FAIL_ON_SKIP=1 a
// selected test that skips itself (GTEST_SKIP: this world size is not its) fails the run, naming it,
// so a ctest entry whose filter selects tests that cannot run on its ranks does not pass as if they had.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "comm/mpi_communicator.h"
#include "test_dirs.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  shardlm::comm::mpi_init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0 && !std::getenv("SHARDLM_TEST_ALL_RANKS")) {  // set it to see every rank's failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = 0;
  const char* strict = std::getenv("SHARDLM_TEST_FAIL_ON_SKIP");
  if (strict && std::string(strict) == "1") {
    const auto& unit = *::testing::UnitTest::GetInstance();
    int skipped = 0;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const auto& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j) {
        const auto& test = *suite.GetTestInfo(j);
        if (!test.should_run() || !test.result()->Skipped()) continue;
        if (rank == 0)
          std::fprintf(stderr, "shardlm: %s.%s skipped itself on %d ranks\n", suite.name(), test.name(), size);
        ++skipped;
      }
    }
    if (skipped) {
      if (rank == 0)
        std::fprintf(stderr,
                     "shardlm: %d selected test(s) skipped with SHARDLM_TEST_FAIL_ON_SKIP=1: leave them out of "
                     "this run's --gtest_filter (tests/tests.cmake) or make them run on this many ranks\n",
                     skipped);
      failed = 1;
    }
  }
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(shardlm::test_support::mpi_test_root());
  shardlm::comm::mpi_finalize();
  return any_failed;
}
