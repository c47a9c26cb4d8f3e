// How much memory a rank may use when the config does not say (device_memory unset): what the
// machine has free now. On the CPU that is the kernel's MemAvailable, or what the cgroup's memory
// limit leaves when that is lower, shared by the ranks of this node; on a GPU the device's free
// memory, shared by the ranks that use it. The memory guard (train::check_plan_fits) compares the
// plan's peak with it, so a run that cannot fit is refused before it allocates anything.
#pragma once
#include <cstdint>
#include <string>

namespace shardlm {

// Bytes the host can still give, and where the number comes from ("MemAvailable 23.5 GB" or
// "cgroup memory limit 8.0 GB - usage 1.2 GB").
struct HostMemory {
  int64_t available = 0;
  std::string source;
};
HostMemory host_available_memory();

// Ranks of this job on this node, from the launcher (OpenMPI, Slurm, MVAPICH, torchrun); 1 alone.
int local_ranks();

// The share of free memory one rank may plan for, and a sentence saying how it was derived.
// device "cpu": host_available_memory() / ranks; with `per_rank_overhead` (the launcher, before the
// ranks exist) each rank's own process (the runtime, libraries) is taken off first.
// device "cuda": the current GPU's free memory / ranks sharing it.
struct MemoryBudget {
  int64_t bytes = 0;
  std::string why;
};
MemoryBudget rank_memory_budget(const std::string& device, int ranks, int64_t per_rank_overhead = 0);

}  // namespace shardlm
