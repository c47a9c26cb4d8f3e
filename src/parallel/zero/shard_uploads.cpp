// See shard_uploads.h.
#include "parallel/zero/shard_uploads.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>

namespace shardlm::parallel {
namespace {

class SyncUploads : public ShardUploads {
 public:
  void start(size_t, const at::Tensor& device, const at::Tensor& host) override { device.copy_(host); }
  void wait(size_t) override {}
};

class CudaUploads : public ShardUploads {
 public:
  explicit CudaUploads(c10::Device device) : device_(device), h2d_(c10::cuda::getStreamFromPool(false, device.index())) {}
  void start(size_t unit, const at::Tensor& device, const at::Tensor& host) override {
    at::cuda::CUDAEvent ready;  // the slot was allocated on the compute stream
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(h2d_);
    {
      const c10::cuda::CUDAStreamGuard on(h2d_);
      device.copy_(host, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(device.storage().data_ptr(), h2d_);
    auto& done = done_[unit];
    done = std::make_unique<at::cuda::CUDAEvent>();
    done->record(h2d_);
  }
  void wait(size_t unit) override {
    const auto it = done_.find(unit);
    if (it == done_.end()) return;
    it->second->block(c10::cuda::getCurrentCUDAStream(device_.index()));
    done_.erase(it);
  }

 private:
  c10::Device device_;
  c10::cuda::CUDAStream h2d_;
  std::map<size_t, std::unique_ptr<at::cuda::CUDAEvent>> done_;
};

}  // namespace

std::unique_ptr<ShardUploads> make_shard_uploads(c10::Device device) {
  if (device.is_cuda()) return std::make_unique<CudaUploads>(device);
  return std::make_unique<SyncUploads>();
}

}  // namespace shardlm::parallel
