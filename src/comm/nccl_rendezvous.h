// What the NCCL backend (nccl_communicator.cpp) needs to connect its ranks, kept apart from the
// operations: the CUDA device check, a short-string all-gather over MPI or a c10d::Store, each
// rank's GPU identity, the rendezvous and side-channel stores, and the agreed ncclUniqueId.
// Only compiled where CMake found NCCL (SHARDLM_WITH_NCCL).
#pragma once
#ifdef SHARDLM_WITH_NCCL
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_bootstrap.h"

namespace shardlm::comm::nccl_detail {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Fails naming the NCCL call and NCCL's error text when r is not ncclSuccess.
void nccl_check(ncclResult_t r, const std::string& call);

// Fails saying why when torch sees no CUDA device or device_index is out of range.
void require_cuda_device(int device_index);

// All-gather of short strings among the ranks being connected: entry r is rank r's string.
using AllGather = std::function<std::vector<std::string>(const std::string& mine)>;
AllGather gather_over(const CommPtr& comm);
AllGather gather_over(const StorePtr& store, const std::string& prefix, int rank, int size);

// Every rank's GPU (refused when two ranks share one).
std::vector<GpuIdentity> gather_gpus(const AllGather& gather, int device_index);

StorePtr open_tcp_store(const std::string& host, int port, bool server);
// Side channel of a communicator bootstrapped over another one: rank 0 hosts a TCPStore on an
// ephemeral port and shares the port; the others connect to it (by loopback when on its host).
StorePtr side_channel_store(const AllGather& gather, int rank, const std::vector<GpuIdentity>& gpus);
// torchrun's agent hosts the store on MASTER_PORT itself when it tells its workers so.
bool agent_hosts_store();
// Keys of one run: a restarted torchrun job reuses the agent's store.
std::string torchrun_key_prefix();

// Rank 0's ncclUniqueId, shared with every rank.
ncclUniqueId agree_unique_id(const AllGather& gather, int rank);

}  // namespace shardlm::comm::nccl_detail
#endif
