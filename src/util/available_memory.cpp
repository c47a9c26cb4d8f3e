// See available_memory.h.
#include "util/available_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "util/device.h"
#include "util/units.h"

namespace shardlm {
namespace {

// A number from a one-value file (cgroup), or -1 when absent or "max".
int64_t read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

HostMemory host_available_memory() {
  HostMemory m;
  std::ifstream info("/proc/meminfo");
  for (std::string key; info >> key;) {
    int64_t kb = 0;
    info >> kb;
    if (key == "MemAvailable:") {
      m.available = kb * 1024;
      m.source = "MemAvailable " + util::format_bytes(static_cast<double>(m.available));
      break;
    }
    info.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  // cgroup v2, then v1: a limit far above the machine's memory means "none".
  struct Files {
    const char *limit, *usage;
  };
  for (const Files f : {Files{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                        Files{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = read_number(f.limit), usage = read_number(f.usage);
    if (limit <= 0 || usage < 0 || limit >= (int64_t{1} << 60)) continue;
    const int64_t left = std::max<int64_t>(0, limit - usage);
    if (m.source.empty() || left < m.available) {
      m.available = left;
      m.source = "cgroup memory limit " + util::format_bytes(static_cast<double>(limit)) + " - usage " +
                 util::format_bytes(static_cast<double>(usage));
    }
    break;
  }
  return m;
}

int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MV2_COMM_WORLD_LOCAL_SIZE",
                          "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
  return 1;
}

MemoryBudget rank_memory_budget(const std::string& device, int ranks, int64_t per_rank_overhead) {
  ranks = std::max(1, ranks);
  MemoryBudget b;
  if (device == "cuda") {
    const int gpus = std::max(1, cuda_device_count());
    const int sharing = (ranks + gpus - 1) / gpus;
    const int64_t free = device_free_memory();
    b.bytes = free / sharing;
    b.why = "the GPU's free memory " + util::format_bytes(static_cast<double>(free)) +
            (sharing > 1 ? " / " + std::to_string(sharing) + " ranks sharing it" : "");
    return b;
  }
  const auto host = host_available_memory();
  b.bytes = (host.available - ranks * per_rank_overhead) / ranks;
  b.why = host.source;
  if (per_rank_overhead > 0)
    b.why += " - " + std::to_string(ranks) + " x " + util::format_bytes(static_cast<double>(per_rank_overhead)) +
             " per rank process (runtime and libraries)";
  if (ranks > 1) b.why = "(" + b.why + ") / " + std::to_string(ranks) + " ranks on this node";
  return b;
}

}  // namespace shardlm
