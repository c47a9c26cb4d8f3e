// See preemption.h.
#include "train/preemption.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace shardlm::train {
namespace {
std::atomic<int> g_stop_signal{0};
volatile sig_atomic_t g_launcher_ending = 0;
pid_t g_openmpi_daemon = 0;  // the mpirun/orted that started this rank (openmpi_daemon_ancestor), else 0
bool g_tty_output[3] = {};   // fds 1 and 2 that are the pseudo-terminals OpenMPI reads the output from

static_assert(std::atomic<int>::is_always_lock_free, "on_stop stores into an atomic: it must be lock-free");

// Async-signal-safe only (signal-safety(7)): a lock-free atomic store, a sig_atomic_t and fcntl,
// with errno kept for the code it interrupted (tests/unit/signal_safety).
void on_stop(int sig, siginfo_t* info, void*) {
  g_stop_signal.store(sig);
  if (sig != SIGTERM || g_openmpi_daemon == 0 || info == nullptr || info->si_pid != g_openmpi_daemon) return;
  g_launcher_ending = 1;
  // The daemon reads no output while it sleeps before its SIGKILL: a rank blocked writing a full
  // pseudo-terminal would never reach the checkpoint. Lines that do not fit are dropped instead
  // (the metrics file keeps them). fcntl is async-signal-safe.
  const int saved_errno = errno;
  for (int fd : {1, 2})
    if (g_tty_output[fd]) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  errno = saved_errno;
}

// The nearest ancestor that is OpenMPI's mpirun or orted (the parent, or the parent of a wrapper
// script mpirun started), 0 when there is none: its SIGTERM means the job is being torn down. A
// SIGTERM from anyone else (srun, the user's shell) is a stop request that MPI_Finalize still serves.
pid_t openmpi_daemon_ancestor() {
  pid_t pid = getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "mpirun" || name == "mpiexec" || name == "orterun" || name == "orted") return pid;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');  // "pid (comm) state ppid ...": comm may hold spaces
    if (close == std::string::npos) return 0;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t parent = 0;
    if (!(rest >> state >> parent)) return 0;
    pid = parent;
  }
  return 0;
}

std::string g_last_stop_message;  // written to stderr too when stdout dropped it
}  // namespace

void install_stop_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  // OpenMPI's daemon puts its contact address in the environment of every process it starts.
  if (std::getenv("OMPI_MCA_orte_local_daemon_uri")) {
    g_openmpi_daemon = openmpi_daemon_ancestor();
    for (int fd : {1, 2}) g_tty_output[fd] = isatty(fd) != 0;
  }
  struct sigaction sa {};
  sa.sa_sigaction = on_stop;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

bool launcher_is_ending_the_job() { return g_launcher_ending != 0; }

void exit_if_launcher_is_ending_the_job() {
  if (!launcher_is_ending_the_job()) return;
  std::fflush(stdout);
  // A full pseudo-terminal dropped stdout's last lines; stderr is a pipe OpenMPI drains at the end.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (std::ferror(stdout) && !g_last_stop_message.empty() && rank && std::string(rank) == "0")
    std::fprintf(stderr, "%s\n", g_last_stop_message.c_str());
  std::fflush(stderr);
  std::_Exit(0);
}

int stop_signal_received() { return g_stop_signal.load(); }

int agreed_stop_signal(comm::Communicator& world) {
  auto flag = at::full({1}, static_cast<int64_t>(stop_signal_received()), at::kLong);
  if (world.size() > 1) world.all_reduce(flag, comm::ReduceOp::Max);
  return static_cast<int>(flag.item<int64_t>());
}

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

}  // namespace shardlm::train

namespace shardlm::train {

StepEnd step_end(int64_t step, int64_t steps, int64_t interval, comm::Communicator& world) {
  StepEnd end;
  if (step >= steps) return end;
  end.stop_signal = agreed_stop_signal(world);
  end.checkpoint = end.stop_signal != 0 || (interval > 0 && step % interval == 0);
  return end;
}

std::string stop_message(int sig, int64_t step, int64_t steps) {
  g_last_stop_message = "shardlm: " + signal_name(sig) + " received: stopped after step " + std::to_string(step) +
                        " of " + std::to_string(steps) + " with its checkpoint saved; run the same command to resume from it";
  return g_last_stop_message;
}

}  // namespace shardlm::train
