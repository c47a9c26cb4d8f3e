// torchrun environment parsing and the one-rank-per-GPU check of the NCCL backend (see nccl_bootstrap.h).
#include "comm/nccl_bootstrap.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "util/error.h"

namespace shardlm::comm {
namespace {

constexpr const char* kEnvHelp =
    "; nccl_world_from_env reads torchrun's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
    "(start under torchrun, set them, or start under mpirun to bootstrap over MPI)";

std::string required_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) fail("environment variable ", name, " is not set", kEnvHelp);
  return v;
}

int int_env(const char* name, long lo, long hi) {
  const std::string text = required_env(name);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi)
    fail("environment variable ", name, "='", text, "' is not an integer in [", lo, ", ", hi, "]", kEnvHelp);
  return static_cast<int>(v);
}

}  // namespace

TorchrunEnv torchrun_env() {
  TorchrunEnv env;
  env.master_addr = required_env("MASTER_ADDR");
  env.master_port = int_env("MASTER_PORT", 0, 65535);
  env.world_size = int_env("WORLD_SIZE", 1, 1 << 24);
  env.rank = int_env("RANK", 0, env.world_size - 1);
  if (env.master_port == 0 && env.world_size > 1)
    fail("MASTER_PORT=0 (an ephemeral port) only works with WORLD_SIZE=1: the other ", env.world_size - 1,
         " rank(s) could not find it", kEnvHelp);
  return env;
}

std::string encode(const GpuIdentity& gpu) {
  return std::to_string(gpu.device_index) + "\n" + gpu.uuid + "\n" + gpu.pci_bus_id + "\n" + gpu.host;
}

GpuIdentity decode_gpu_identity(const std::string& text) {
  std::istringstream in(text);
  GpuIdentity gpu;
  std::string index;
  std::getline(in, index);
  std::getline(in, gpu.uuid);
  std::getline(in, gpu.pci_bus_id);
  std::getline(in, gpu.host);
  gpu.device_index = std::atoi(index.c_str());
  return gpu;
}

void refuse_shared_gpus(const std::vector<GpuIdentity>& gpus) {
  for (size_t a = 0; a < gpus.size(); ++a)
    for (size_t b = a + 1; b < gpus.size(); ++b) {
      if (gpus[a].uuid != gpus[b].uuid) continue;
      const auto& g = gpus[a];
      std::ostringstream where;
      where << "PCI " << g.pci_bus_id << " on host " << g.host << ", " << g.uuid;
      if (gpus[b].device_index != g.device_index) where << "; rank " << b << " calls it GPU " << gpus[b].device_index;
      fail("NCCL cannot run two ranks on one GPU: ranks ", a, " and ", b, " both use GPU ", g.device_index, " (",
           where.str(), "); use comm.backend=mpi for that layout, or one rank per GPU");
    }
}

}  // namespace shardlm::comm
