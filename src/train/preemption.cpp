// See preemption.h.
#include "train/preemption.h"

#include <ATen/ATen.h>

#include <atomic>
#include <csignal>

namespace shardlm::train {
namespace {
std::atomic<int> g_stop_signal{0};
void on_stop(int sig) { g_stop_signal.store(sig); }
}  // namespace

void install_stop_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
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
  return "shardlm: " + signal_name(sig) + " received: stopped after step " + std::to_string(step) + " of " +
         std::to_string(steps) + " with its checkpoint saved; run the same command to resume from it";
}

}  // namespace shardlm::train
