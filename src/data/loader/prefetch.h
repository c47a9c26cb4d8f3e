// Keeps the next batches ready while the step runs, so the trainer never waits on the data. The
// loader's order is a pure function of the micro-step (data_loader.h), so prefetching needs no
// state of its own beyond a guess of what comes next: after micro-step m is handed out, a worker
// thread assembles m + 1, ..., m + depth in host memory (pinned for a GPU) and, for a GPU, copies
// them on a copy stream of its own, so the copy runs while the step's kernels do; taking a batch
// makes the caller's stream wait for its copy (an event, not the host) and marks the tensors as used
// on that stream for the caching allocator. A request for anything else (the next step after
// evaluation, a resume) drops what was prepared and starts over from there.
// So what a step reads, and the trajectory, are the same with any depth (0: assemble on the caller's
// thread); only where the time goes changes. An error assembling a batch reaches the caller when it
// asks for that batch.
#pragma once
#include <c10/core/Device.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "data/loader/data_loader.h"

namespace shardlm::data {

class BatchPrefetcher {
 public:
  // depth: batches kept ready ahead of the last one taken; 0 starts no thread.
  BatchPrefetcher(std::unique_ptr<DataLoader> loader, int depth, c10::Device device);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The loader's batch of micro-step m on the device; waits for it if it is being assembled.
  DataLoader::Batch batch(int64_t micro_step);
  const DataLoader& loader() const { return *loader_; }
  int depth() const { return depth_; }

 private:
  struct Slot {
    DataLoader::Batch batch;
    std::exception_ptr error;
    std::shared_ptr<void> copied;  // GPU: the event recorded on the copy stream after the batch's copy
  };
  void work();

  std::unique_ptr<DataLoader> loader_;
  const int depth_;
  const c10::Device device_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Slot> ready_;  // assembled batches by micro-step
  int64_t wanted_ = 0;             // the first micro-step the worker should have ready
  int64_t next_ = 0;               // the next micro-step the worker assembles
  uint64_t generation_ = 0;        // bumped when a request drops the prepared batches
  bool started_ = false, stop_ = false;
  std::thread worker_;
};

}  // namespace shardlm::data
