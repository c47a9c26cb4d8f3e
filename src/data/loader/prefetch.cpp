// See prefetch.h.
#include "data/loader/prefetch.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
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
  // A GPU's batches are copied on this thread's own stream (built only for a CUDA device).
  std::optional<c10::cuda::CUDAGuard> on_device;
  std::optional<c10::cuda::CUDAStream> copy_stream;
  if (device_.is_cuda()) {
    on_device.emplace(device_);
    copy_stream.emplace(c10::cuda::getStreamFromPool(false, device_.index()));
  }
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
      if (copy_stream) {
        const c10::cuda::CUDAStreamGuard on_copy_stream(*copy_stream);
        slot.batch = DataLoader::to_device(std::move(slot.batch), device_);  // asynchronous, from pinned memory
        auto copied = std::make_shared<at::cuda::CUDAEvent>();
        copied->record(*copy_stream);
        slot.copied = copied;
      }
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
  if (!slot.copied) return DataLoader::to_device(std::move(slot.batch), device_);
  // Copied on the worker's stream: the step's stream waits for it, and the allocator may not reuse
  // the tensors' memory until the step's stream is done with them.
  const auto stream = c10::cuda::getCurrentCUDAStream(device_.index());
  std::static_pointer_cast<at::cuda::CUDAEvent>(slot.copied)->block(stream);
  for (const at::Tensor* t : {&slot.batch.inputs, &slot.batch.targets, &slot.batch.positions, &slot.batch.segments})
    if (t->defined()) c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), stream);
  return std::move(slot.batch);
}

}  // namespace shardlm::data
