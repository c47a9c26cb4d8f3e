// The checks that decide whether an NCCL communicator can be built, kept free of CUDA and NCCL so
// they compile (and are tested) everywhere: reading torchrun's environment variables and refusing
// two ranks on one physical GPU, which NCCL does not support.
#pragma once
#include <string>
#include <vector>

namespace shardlm::comm {

// torchrun's rendezvous variables. torchrun_env() fails naming the variable that is missing or bad.
struct TorchrunEnv {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
};
TorchrunEnv torchrun_env();

// One rank's GPU as every rank sees it. uuid identifies the physical device across hosts.
struct GpuIdentity {
  int device_index = 0;
  std::string uuid, pci_bus_id, host;
};
std::string encode(const GpuIdentity& gpu);
GpuIdentity decode_gpu_identity(const std::string& text);

// Fails naming the first two ranks (index = rank) that use the same physical GPU.
void refuse_shared_gpus(const std::vector<GpuIdentity>& gpus);

}  // namespace shardlm::comm
