// See report_watch.h. A signal handler only sets a flag (async-signal-safe); the loop sleeps in
// short slices and looks at it.
#include "report/report_watch.h"

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "report/report.h"
#include "util/error.h"
#include "util/out_dir_lock.h"

namespace shardlm::observe {
namespace {

volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

// Sleeps `seconds`, or less when a stop signal arrives.
void nap(int seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!g_signal && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

int watch_report(const std::string& run_dir, const std::string& out_file, int seconds,
                 const std::function<void(const std::string&)>& say) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_signal = 0;
  const auto metrics = std::filesystem::path(run_dir) / "metrics.jsonl";
  bool waited = false;
  std::string stop;
  for (;;) {
    // Read before the rewrite: a run seen stopped here has written all it will.
    const bool running = OutDirLock::held(run_dir);
    if (running && !std::filesystem::exists(metrics)) {
      if (!waited) say("report: waiting for the run's first step in " + metrics.string());
      waited = true;
    } else if (running) {
      try {
        say("report: wrote " + write_report(run_dir, out_file, seconds) + " (the run is training; next in " +
            std::to_string(seconds) + " s)");
      } catch (const Error& e) {  // a file caught mid-write (memory.json): read it again next time
        say(std::string("report: not rewritten this time: ") + e.what());
      }
    } else {
      say("report: wrote " + write_report(run_dir, out_file) + "; the run is not running (out_dir's lock is free): stopped");
      break;
    }
    nap(seconds);
    if (g_signal) {
      stop = g_signal == SIGINT ? "SIGINT" : "SIGTERM";
      break;
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (!stop.empty() && std::filesystem::exists(metrics)) {
    // The page stops reloading itself: no one rewrites it any more.
    say("report: wrote " + write_report(run_dir, out_file) + "; stopped by " + stop);
  } else if (!stop.empty()) {
    say("report: stopped by " + stop);
  }
  return 0;
}

}  // namespace shardlm::observe
