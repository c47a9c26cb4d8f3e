// Where multi-rank tests write: one directory per mpirun (named by mpirun's pid, which every rank
// shares), under $TMPDIR, removed by mpi_main.cpp when the run ends, so runs never collide and
// nothing is left behind.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace shardlm::test_support {

inline std::string mpi_test_root() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/shardlm_mpi_test_" + std::to_string(getppid());
}

inline std::string mpi_test_path(const std::string& name) {
  std::filesystem::create_directories(mpi_test_root());
  return mpi_test_root() + "/" + name;
}

}  // namespace shardlm::test_support
