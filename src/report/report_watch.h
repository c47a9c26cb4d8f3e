// `shardlm report RUN_DIR --watch [SECONDS]`: a live report for users without TensorBoard. It
// rewrites the page every SECONDS while the run trains (the page reloads itself at the same pace),
// and stops once the run no longer holds out_dir's lock (util/out_dir_lock.h: the trainer holds it
// from start to exit, and the kernel drops it when the run dies), after one last rewrite, or on
// SIGINT / SIGTERM.
#pragma once
#include <functional>
#include <string>

namespace shardlm::observe {

// Returns 0; fails as write_report does when the run is not running and run_dir cannot be read.
// `say` receives one line per event (a rewrite, waiting for the first step, the stop and why).
int watch_report(const std::string& run_dir, const std::string& out_file, int seconds,
                 const std::function<void(const std::string&)>& say);

}  // namespace shardlm::observe
