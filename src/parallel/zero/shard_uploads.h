// Parameter offload on a device apart from the host (zero_optimization.offload_param.device "cpu" or
// "nvme" on a GPU, ZeroOptions::offload_param_apart): a unit's compute shard lives in host memory (or
// its file lands in a host bounce buffer) and must reach its slot of the device gather buffer before
// the all-gather runs in place. This moves it: on a GPU on a side stream, ordered after the work the
// compute stream has queued (the slot's allocation) and awaited by the compute stream right before the
// gather, so the copy overlaps the compute of the prefetch window; on a CPU device synchronously (the
// GPU layout run with plain copies, for tests).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace shardlm::parallel {

class ShardUploads {
 public:
  virtual ~ShardUploads() = default;
  // Starts copying host -> device (same dtype and numel) for `unit`. Host memory should be pinned on a
  // GPU and must not change until wait(unit).
  virtual void start(size_t unit, const at::Tensor& device, const at::Tensor& host) = 0;
  // Work queued on the device from here on (the gather) follows unit's copy; no-op when none started.
  virtual void wait(size_t unit) = 0;
};

std::unique_ptr<ShardUploads> make_shard_uploads(c10::Device device);

}  // namespace shardlm::parallel
