// See device.h.
#include "util/device.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <unistd.h>

#include <cstdlib>

#include "util/error.h"
#include "util/hostfile.h"

namespace shardlm {

int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                          "MPI_LOCALRANKID"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int cuda_device_count() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {  // no driver: the library reports it by throwing
    return 0;
  }
}

void require_device(const std::string& kind) {
  if (kind == "cpu") return;
  if (kind != "cuda") fail("device must be \"cpu\" or \"cuda\", got \"", kind, "\"");
  if (cuda_device_count() == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    fail("--device cuda: no CUDA GPU is visible to this process (CUDA_VISIBLE_DEVICES=",
         visible ? visible : "<unset>", "; no NVIDIA driver, or no GPU on this machine). Run on a GPU machine, "
         "or train on the CPU with --device cpu");
  }
}

c10::Device select_device(const std::string& kind) {
  require_device(kind);
  if (kind == "cpu") return c10::Device(c10::kCPU);
  const int n = cuda_device_count();
  int index = local_rank() % n;
  if (const char* map = std::getenv("SHARDLM_HOST_SLOTS")) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    const auto slots = util::host_slots(map, name);
    if (!slots.empty()) {
      if (local_rank() >= static_cast<int>(slots.size()) || slots[local_rank()] >= n)
        fail("SHARDLM_HOST_SLOTS gives host ", name, " slots ", map, " but local rank ", local_rank(), " has none of the ",
             n, " GPU(s) there (check the hostfile's slots=N against the GPUs)");
      index = slots[local_rank()];
    }
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

DeviceMemory device_memory(c10::Device device) {
  DeviceMemory m;
  if (!device.is_cuda()) return m;
  using c10::CachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const auto& a = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  const auto& r = stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  m.allocated = a.current;
  m.peak_allocated = a.peak;
  m.reserved = r.current;
  m.peak_reserved = r.peak;
  return m;
}

void reset_device_peaks(c10::Device device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

int64_t device_free_memory() {
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

void synchronize(c10::Device device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}

}  // namespace shardlm
