// See prefetch.h.
#include "data/prefetch.h"

#include <utility>

namespace shardlm::data {

BatchPrefetcher::BatchPrefetcher(std::unique_ptr<DataLoader> loader, int depth, c10::Device device)
    : loader_(std::move(loader)), depth_(depth < 0 ? 0 : depth), device_(device) {
  if (depth_ > 0) worker_ = std::thread([this] { work(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchPrefetcher::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || (started_ && next_ < wanted_ + depth_); });
    if (stop_) return;
    const int64_t m = next_++;
    const uint64_t generation = generation_;
    lock.unlock();
    Slot slot;
    try {
      slot.batch = loader_->host_batch(m, device_.is_cuda());
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.lock();
    if (generation == generation_) ready_[m] = std::move(slot);  // else a request moved elsewhere meanwhile
    cv_.notify_all();
  }
}

DataLoader::Batch BatchPrefetcher::batch(int64_t micro_step) {
  if (depth_ == 0) return loader_->batch(micro_step, device_);
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool coming = started_ && micro_step >= wanted_ && micro_step < next_;
    if (!coming && !ready_.count(micro_step)) {  // not the guess: start over from here
      ready_.clear();
      ++generation_;
      next_ = micro_step;
    }
    started_ = true;
    wanted_ = micro_step;
    cv_.notify_all();
    cv_.wait(lock, [&] { return ready_.count(micro_step) > 0; });
    slot = std::move(ready_[micro_step]);
    ready_.erase(ready_.begin(), ready_.upper_bound(micro_step));
    wanted_ = micro_step + 1;  // the worker goes on to micro_step + depth
    if (next_ < wanted_) next_ = wanted_;
  }
  cv_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return DataLoader::to_device(std::move(slot.batch), device_);
}

}  // namespace shardlm::data
