#include "cli/launch.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cli/error_text.h"
#include "comm/flight_recorder.h"
#include "util/error.h"

namespace shardlm::cli {

bool under_mpi_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void keep_freed_memory() {
  // SHARDLM_GLIBC_MALLOC_DEFAULTS=1 leaves glibc's policy as it is (to measure what this buys).
  if (const char* keep_defaults = std::getenv("SHARDLM_GLIBC_MALLOC_DEFAULTS"); keep_defaults && *keep_defaults == '1')
    return;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
  mallopt(M_ARENA_MAX, 1);
}

void check_local_rank_count(int nproc) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (nproc > kMaxRanksPerCore * cores)
    fail("--nproc ", nproc, " starts that many ranks on this machine, which has ", cores, " core(s): beyond ",
         kMaxRanksPerCore, " ranks per core (", kMaxRanksPerCore * cores, " here) every rank waiting in MPI spins its "
         "core and the job would stall. Use at most ", kMaxRanksPerCore * cores, " local ranks, or launch across "
         "nodes with mpirun/srun yourself (--nproc starts local ranks only)");
}

void relaunch_with_mpirun(int nproc, const std::vector<std::string>& command_args) {
  check_local_rank_count(nproc);
  const std::string command = command_args.empty() ? std::string() : command_args.front();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) fail("cannot find the shardlm executable to relaunch under mpirun");
  self[n] = 0;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(nproc)};
  if (nproc > static_cast<int>(std::thread::hardware_concurrency())) cmd.push_back("--oversubscribe");
  cmd.insert(cmd.end(), {"--bind-to", "none", self});
  cmd.insert(cmd.end(), command_args.begin(), command_args.end());
  std::vector<char*> argv;
  for (auto& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execvp("mpirun", argv.data());
  fail("could not start mpirun (", std::strerror(errno), "); install openmpi-bin (scripts/setup.sh) or launch the "
       "ranks yourself with mpirun -n N build/shardlm ", command, " ...");
}

void exit_after_rank_error(const char* command, int rank, int size, const std::exception& error) {
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto text = describe_error(error);  // out of memory and library errors worded (cli/error_text.h)
  // A rank that communicated leaves its flight record (`shardlm diagnose`); one that failed before
  // its first collective (a bad config or data file) writes nothing.
  if (comm::flight_recorder().recorded() > 0) comm::flight_recorder().dump("error: " + text.message);
  std::fprintf(stderr, "shardlm %s%s: %s: %s\n", command,
               size > 1 ? (" [rank " + std::to_string(rank) + "]").c_str() : "", text.internal ? "internal error" : "error",
               text.message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace shardlm::cli
