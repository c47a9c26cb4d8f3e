// gtest main for tests that run inside `mpirun -n N`: initialises MPI, lets only rank 0 print
// results, and makes the exit code reflect a failure on any rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>

#include "comm/mpi_communicator.h"
#include "test_dirs.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  shardlm::comm::mpi_init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 && !std::getenv("SHARDLM_TEST_ALL_RANKS")) {  // set it to see every rank's failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(shardlm::test_support::mpi_test_root());
  shardlm::comm::mpi_finalize();
  return any_failed;
}
