// The NCCL backend's rendezvous (see nccl_rendezvous.h): everything nccl_communicator.cpp does before
// ncclCommInitRank, moved out so that file holds the operations. Built only with SHARDLM_WITH_NCCL.
#include "comm/nccl_rendezvous.h"

#ifdef SHARDLM_WITH_NCCL
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iomanip>
#include <memory>
#include <sstream>

#include "util/error.h"

namespace shardlm::comm::nccl_detail {

void nccl_check(ncclResult_t r, const std::string& call) {
  if (r != ncclSuccess) fail("NCCL ", call, " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")");
}

std::string visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? v : "unset";
}

void require_cuda_device(int device_index) {
  const int count = c10::cuda::device_count();
  if (count == 0)
    fail("comm.backend=nccl needs a CUDA GPU, and torch sees none (CUDA_VISIBLE_DEVICES=", visible_devices(),
         "). Run on a GPU machine, or use --device cpu / comm.backend=mpi");
  if (device_index < 0 || device_index >= count)
    fail("comm.backend=nccl: device_index ", device_index, " is out of range: torch sees ", count,
         " CUDA device(s) (CUDA_VISIBLE_DEVICES=", visible_devices(), "), numbered 0..", count - 1);
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

GpuIdentity this_gpu(int device_index) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device_index));
  char pci[32];
  std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", p->pciDomainID, p->pciBusID, p->pciDeviceID);
  std::ostringstream uuid;
  uuid << "GPU-" << std::hex << std::setfill('0');
  for (char byte : p->uuid.bytes) uuid << std::setw(2) << (static_cast<unsigned>(byte) & 0xffu);
  return {device_index, uuid.str(), pci, host_name()};
}

constexpr int64_t kGatherBytes = 512;

AllGather gather_over(const CommPtr& comm) {
  return [comm](const std::string& mine) {
    if (static_cast<int64_t>(mine.size()) >= kGatherBytes) fail("NCCL bootstrap: message of ", mine.size(), " bytes");
    auto in = at::zeros({kGatherBytes}, at::kByte);
    std::memcpy(in.data_ptr(), mine.data(), mine.size());
    auto out = at::empty({comm->size() * kGatherBytes}, at::kByte);
    comm->all_gather(in, out);
    std::vector<std::string> all;
    for (int r = 0; r < comm->size(); ++r) {
      const char* entry = static_cast<const char*>(out.data_ptr()) + r * kGatherBytes;
      all.emplace_back(entry, strnlen(entry, kGatherBytes));
    }
    return all;
  };
}

AllGather gather_over(const StorePtr& store, const std::string& prefix, int rank, int size) {
  auto round = std::make_shared<int>(0);
  return [=](const std::string& mine) {
    const std::string dir = prefix + "gather/" + std::to_string((*round)++) + "/";
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(dir + std::to_string(r));
    store->set(keys[rank], mine);
    try {
      store->wait(keys);
    } catch (const std::exception& e) {
      std::ostringstream absent;
      for (int r = 0; r < size; ++r)
        if (!store->check({keys[r]})) absent << (absent.tellp() > 0 ? ", " : "") << r;
      fail("NCCL bootstrap: rank(s) ", absent.str(), " never reached the rendezvous store (", e.what(), ")");
    }
    std::vector<std::string> all;
    for (const auto& k : keys) {
      const auto v = store->get(k);
      all.emplace_back(v.begin(), v.end());
    }
    return all;
  };
}

std::vector<GpuIdentity> gather_gpus(const AllGather& gather, int device_index) {
  std::vector<GpuIdentity> gpus;
  for (const auto& text : gather(encode(this_gpu(device_index)))) gpus.push_back(decode_gpu_identity(text));
  refuse_shared_gpus(gpus);
  return gpus;
}

StorePtr open_tcp_store(const std::string& host, int port, bool server) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = server;
  opts.waitWorkers = false;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    fail("NCCL bootstrap: could not ", server ? "host" : "reach", " the rendezvous store at ", host, ":", port, " (",
         e.what(), ")");
  }
}

// Side channel of a communicator bootstrapped over another one: rank 0 hosts a TCPStore on an
// ephemeral port and shares the port; the others connect to it (by loopback when on its host).
StorePtr side_channel_store(const AllGather& gather, int rank, const std::vector<GpuIdentity>& gpus) {
  StorePtr server = rank == 0 ? open_tcp_store("127.0.0.1", 0, true) : StorePtr();
  const std::string port = gather(rank == 0 ? std::to_string(static_cast<c10d::TCPStore&>(*server).getPort()) : "")[0];
  if (rank == 0) return server;
  return open_tcp_store(gpus[rank].host == gpus[0].host ? "127.0.0.1" : gpus[0].host, std::stoi(port), false);
}

// torchrun's agent hosts the store on MASTER_PORT itself when it tells its workers so.
bool agent_hosts_store() {
  const char* v = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return v && std::string(v) == "True";
}

// Keys of one run: a restarted torchrun job reuses the agent's store.
std::string torchrun_key_prefix() {
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::string("shardlm/") + (restart ? restart : "0") + "/";
}

std::string to_hex(const ncclUniqueId& id) {
  std::ostringstream out;
  out << std::hex << std::setfill('0');
  for (char byte : id.internal) out << std::setw(2) << (static_cast<unsigned>(byte) & 0xffu);
  return out.str();
}

ncclUniqueId from_hex(const std::string& text) {
  ncclUniqueId id{};
  if (text.size() != 2 * sizeof id.internal) fail("NCCL bootstrap: rank 0 sent a malformed ncclUniqueId");
  for (size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = static_cast<char>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  return id;
}

ncclUniqueId agree_unique_id(const AllGather& gather, int rank) {
  ncclUniqueId id{};
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return from_hex(gather(rank == 0 ? to_hex(id) : "")[0]);
}

}  // namespace shardlm::comm::nccl_detail
#endif
