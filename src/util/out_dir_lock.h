// One job per out_dir: two jobs writing the same directory would interleave metrics.jsonl and
// overwrite each other's checkpoints. The rank that writes (the logging rank) holds an flock on
// out_dir/.lock for as long as it runs and records its pid and host there; a second job is refused,
// naming the holder. The kernel drops the lock when the holder dies (kill -9 included), so a stale
// .lock file of a dead process never blocks. The launcher probes the lock before it starts ranks.
#pragma once
#include <string>

namespace shardlm {

class OutDirLock {
 public:
  // Creates out_dir if needed and takes the lock; fails naming the holder when another process has it.
  explicit OutDirLock(const std::string& out_dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

  // Fails naming the holder when some process holds out_dir's lock; creates nothing.
  static void check_free(const std::string& out_dir);
  // True while some process holds out_dir's lock (a run is writing it); creates nothing.
  static bool held(const std::string& out_dir);

 private:
  int fd_ = -1;
};

}  // namespace shardlm
