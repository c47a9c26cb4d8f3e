// Which device a rank computes on, and what that device's memory allocator holds. Every buffer a
// strategy allocates goes on the device chosen here; ranks map to GPUs by their local rank (the
// launcher's per-node index), so N ranks on a node with N GPUs get one GPU each.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm {

// This process's index among the ranks of its node, from the launcher (OpenMPI, Slurm, torchrun,
// MVAPICH); 0 when started alone.
int local_rank();

// GPUs this process sees (0 on machines without CUDA or a driver).
int cuda_device_count();

// Fails, naming the fix, when kind is "cuda" and no GPU is visible (cheap: creates no CUDA context).
void require_device(const std::string& kind);

// "cpu" -> CPU. "cuda" -> GPU local_rank mod cuda_device_count(), made the current device; under
// SHARDLM_HOST_SLOTS naming this host (util/hostfile.h: host_slots), GPU slots[local_rank] instead.
// Fails at once, naming the fix, when no GPU is visible.
c10::Device select_device(const std::string& kind);

// The CUDA caching allocator's counters for `device` (all zero for CPU): bytes in tensors now and
// at their peak, and bytes the allocator holds from the driver (reserved >= allocated).
struct DeviceMemory {
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
};
DeviceMemory device_memory(c10::Device device);
void reset_device_peaks(c10::Device device);
// Bytes free on the current GPU (cudaMemGetInfo: what the driver can still give this process).
int64_t device_free_memory();
// Waits until all work queued on the device is done (no-op on CPU): for honest step times.
void synchronize(c10::Device device);

}  // namespace shardlm
