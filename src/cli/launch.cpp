#include "cli/launch.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <csignal>
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
namespace {
volatile pid_t g_mpirun_child = 0;  // read by the launcher's signal handler
volatile sig_atomic_t g_stop_requested = 0;
}  // namespace

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

bool stop_requested() { return g_stop_requested != 0; }

void relaunch_with_mpirun(int nproc, const std::vector<std::string>& command_args, const std::string& hostfile_text) {
  std::exit(run_mpirun(nproc, command_args, hostfile_text));
}

int run_mpirun(int nproc, const std::vector<std::string>& command_args, const std::string& hostfile_text) {
  if (hostfile_text.empty()) check_local_rank_count(nproc);
  const std::string command = command_args.empty() ? std::string() : command_args.front();
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) fail("cannot find the shardlm executable to relaunch under mpirun");
  self[n] = 0;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(nproc)};
  std::string hostfile;  // OpenMPI's copy of the hostfile selection, removed when the job ends
  if (!hostfile_text.empty()) {
    char path[] = "/tmp/shardlm-hostfile-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) fail("cannot write the launch hostfile in /tmp: ", std::strerror(errno));
    const bool written = write(fd, hostfile_text.data(), hostfile_text.size()) == static_cast<ssize_t>(hostfile_text.size());
    close(fd);
    if (!written) fail("cannot write the launch hostfile ", path);
    hostfile = path;
    // Ranks fill the hosts in order; the environment the ranks need travels to remote hosts.
    cmd.insert(cmd.end(), {"--hostfile", hostfile, "--map-by", "slot"});
    for (const char* var : {"SHARDLM_HOST_SLOTS", "OMP_NUM_THREADS", "SHARDLM_VENV", "SHARDLM_RESTARTS"})
      if (std::getenv(var)) cmd.insert(cmd.end(), {"-x", var});
  } else if (nproc > static_cast<int>(std::thread::hardware_concurrency())) {
    cmd.push_back("--oversubscribe");
  }
  cmd.insert(cmd.end(), {"--bind-to", "none", self});
  cmd.insert(cmd.end(), command_args.begin(), command_args.end());
  std::vector<char*> argv;
  for (auto& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // mpirun stays a child of this process, which forwards a stop request to it as SIGUSR1: OpenMPI
  // 4.1 answers SIGTERM by ending the job with exit status 1 and killing the ranks
  // odls_base_sigkill_timeout seconds later (train/preemption.h), but forwards SIGUSR1 to them, and
  // each rank treats both as "stop after this step": with SIGUSR1 the job ends with exit 0.
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) fail("cannot start mpirun: pipe: ", std::strerror(errno));
  const pid_t child = fork();
  if (child < 0) fail("cannot start mpirun: fork: ", std::strerror(errno));
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher killed (kill -9): the job goes with it
    execvp("mpirun", argv.data());
    const int err = errno;
    if (write(ready[1], &err, sizeof err) < 0) {}  // tells the parent exec failed
    _exit(127);
  }
  close(ready[1]);
  int exec_errno = 0;
  const bool exec_failed = read(ready[0], &exec_errno, sizeof exec_errno) == static_cast<ssize_t>(sizeof exec_errno);
  close(ready[0]);
  if (exec_failed) {
    waitpid(child, nullptr, 0);
    if (!hostfile.empty()) unlink(hostfile.c_str());
    fail("could not start mpirun (", std::strerror(exec_errno), "); install openmpi-bin (scripts/setup.sh) or launch "
         "the ranks yourself with mpirun -n N build/shardlm ", command, " ...");
  }
  g_mpirun_child = child;
  struct sigaction forward {};
  forward.sa_handler = [](int) {  // async-signal-safe only: a sig_atomic_t and kill(2), errno kept
    const int saved_errno = errno;
    g_stop_requested = 1;
    if (g_mpirun_child > 0) kill(g_mpirun_child, SIGUSR1);
    errno = saved_errno;
  };
  sigemptyset(&forward.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1}) sigaction(sig, &forward, nullptr);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_mpirun_child = 0;
  if (!hostfile.empty()) unlink(hostfile.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
