// NCCL implementation of Communicator (semantics in nccl_communicator.h). Construction checks the
// device, exchanges every rank's GPU identity and the ncclUniqueId over a bootstrap channel (a
// Communicator, or a c10d::Store for torchrun-style runs); each operation is queued on the
// communicator's own stream, fenced by CUDA events against the caller's stream; a watchdog thread
// turns an operation that never finishes into the MPI backend's message, finding the missing ranks
// through a c10d::Store side channel (the watchdog may not call MPI). Built only when CMake found
// NCCL (SHARDLM_WITH_NCCL); otherwise the factories say so. The steps before ncclCommInitRank (device
// check, GPU identities, stores, ncclUniqueId) are in nccl_rendezvous.cpp.
#include "comm/nccl_communicator.h"

#include "util/error.h"

#ifdef SHARDLM_WITH_NCCL
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/all_to_all.h"
#include "comm/flight_recorder.h"
#include "comm/nccl_bootstrap.h"
#include "comm/nccl_rendezvous.h"
#include "comm/staging.h"
#include "comm/stuck_ranks.h"
#include "comm/timeout_report.h"
#endif

namespace shardlm::comm {
#ifdef SHARDLM_WITH_NCCL
namespace {

using Clock = std::chrono::steady_clock;
using namespace nccl_detail;  // the rendezvous (nccl_rendezvous.h)

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      fail("communicator: the NCCL backend does not move ", t.scalar_type(),
           " tensors; it takes float32/64, bf16, fp16, int32/64, uint8 and int8");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// ---- operations --------------------------------------------------------------------------------

// One operation in flight, shared by its Work and the watchdog.
class InFlight {
 public:
  InFlight(std::string op, std::string detail, int64_t seq, int peer, double timeout_s)
      : op(std::move(op)), detail(std::move(detail)), seq(seq), peer(peer), timeout_s(timeout_s) {}

  const std::string op, detail;
  const int64_t seq;
  const int peer;  // send/recv/broadcast: the rank waited on; -1 for collectives
  const double timeout_s;
  const Clock::time_point launched = Clock::now();
  at::cuda::CUDAEvent done;  // recorded on the communication stream after the NCCL call
  int64_t recorder = -1;     // the flight recorder's entry

  // True once the GPU finished it; the first call that sees so records the in-flight time.
  bool poll() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!inflight_s_ && done.query()) {
      inflight_s_ = seconds_since(launched);
      flight_recorder().complete(recorder);
    }
    return inflight_s_.has_value();
  }
  // Launch to observed completion, once poll() saw it.
  std::optional<double> inflight_seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return inflight_s_;
  }

 private:
  std::mutex mu_;
  std::optional<double> inflight_s_;
};

class NcclCommunicator;

class NcclWork : public Work {
 public:
  NcclWork(NcclCommunicator* comm, std::shared_ptr<InFlight> flight, Staging staging, bool host_blocking)
      : comm_(comm), flight_(std::move(flight)), staging_(std::move(staging)), host_blocking_(host_blocking) {}
  bool test() override {
    if (!flight_->poll()) return false;
    staging_.finish();
    return true;
  }
  void wait() override;

 private:
  NcclCommunicator* comm_;
  std::shared_ptr<InFlight> flight_;
  Staging staging_;
  bool host_blocking_;  // CPU tensors or a barrier: wait() returns once the GPU finished
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device_index, StorePtr store, std::string key_prefix, std::string name,
                   std::vector<int> world_ranks)
      : comm_(comm),
        device_(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index)),
        stream_(c10::cuda::getStreamFromPool(false, device_.index())),
        store_(std::move(store)),
        prefix_(std::move(key_prefix)),
        name_(std::move(name)),
        world_ranks_(std::move(world_ranks)) {
    nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
    if (static_cast<int>(world_ranks_.size()) != size_)
      fail("NCCL communicator '", name_, "' has ", size_, " ranks where ", world_ranks_.size(), " were expected");
    channel_.comm_name = name_;
    channel_.rank = rank_;
    channel_.size = size_;
    channel_.world_ranks = world_ranks_;
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    // Unwinding from an error: peers may never finish what is in flight, and ncclCommDestroy
    // would wait for them; abort instead.
    const bool drained = std::uncaught_exceptions() == 0 && drain();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    if (drained) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  WorkPtr all_reduce_async(const at::Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    Staging s(device_);
    const auto d = s.stage(t, Flow::InOut);
    return launch("all_reduce", t, -1, std::move(s), false, [&](cudaStream_t stream) {
      return ncclAllReduce(d.data_ptr(), d.data_ptr(), d.numel(), nccl_type(d), nccl_op(op), comm_, stream);
    });
  }
  WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override {
    check_tensor(in, "reduce_scatter");
    check_tensor(out, "reduce_scatter");
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type())
      fail("reduce_scatter: input has ", in.numel(), " elements, output ", out.numel(), "; need input = ", size_,
           " x output and equal dtypes");
    Staging s(device_);
    const auto din = s.stage(in, Flow::In), dout = s.stage(out, Flow::Out);
    return launch("reduce_scatter", in, -1, std::move(s), false, [&](cudaStream_t stream) {
      return ncclReduceScatter(din.data_ptr(), dout.data_ptr(), dout.numel(), nccl_type(din), nccl_op(op), comm_,
                               stream);
    });
  }
  WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    check_tensor(in, "all_gather");
    check_tensor(out, "all_gather");
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type())
      fail("all_gather: input has ", in.numel(), " elements, output ", out.numel(), "; need output = ", size_,
           " x input and equal dtypes");
    Staging s(device_);
    const auto din = s.stage(in, Flow::In), dout = s.stage(out, Flow::Out);
    return launch("all_gather", in, -1, std::move(s), false, [&](cudaStream_t stream) {
      return ncclAllGather(din.data_ptr(), dout.data_ptr(), din.numel(), nccl_type(din), comm_, stream);
    });
  }
  WorkPtr broadcast_async(const at::Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    Staging s(device_);
    const auto d = s.stage(t, root == rank_ ? Flow::In : Flow::Out);
    return launch("broadcast", t, root == rank_ ? -1 : root, std::move(s), false, [&](cudaStream_t stream) {
      return ncclBroadcast(d.data_ptr(), d.data_ptr(), d.numel(), nccl_type(d), root, comm_, stream);
    });
  }
  WorkPtr send_async(const at::Tensor& t, int dst, int /*tag: NCCL matches in issue order*/) override {
    check_tensor(t, "send");
    Staging s(device_);
    const auto d = s.stage(t, Flow::In);
    return launch("send", t, dst, std::move(s), false, [&](cudaStream_t stream) {
      return ncclSend(d.data_ptr(), d.numel(), nccl_type(d), dst, comm_, stream);
    });
  }
  WorkPtr recv_async(const at::Tensor& t, int src, int /*tag: NCCL matches in issue order*/) override {
    check_tensor(t, "recv");
    Staging s(device_);
    const auto d = s.stage(t, Flow::Out);
    return launch("recv", t, src, std::move(s), false, [&](cudaStream_t stream) {
      return ncclRecv(d.data_ptr(), d.numel(), nccl_type(d), src, comm_, stream);
    });
  }
  // NCCL has no barrier: a one-element all-reduce whose wait() blocks the host.
  WorkPtr barrier_async() override {
    Staging s(device_);
    const auto d = s.stage(at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_)), Flow::InOut);
    return launch("barrier", at::Tensor(), -1, std::move(s), true, [&](cudaStream_t stream) {
      return ncclAllReduce(d.data_ptr(), d.data_ptr(), 1, ncclInt32, ncclSum, comm_, stream);
    });
  }

  // NCCL has no all_to_allv: one ncclSend and one ncclRecv per peer with a non-empty piece (this
  // rank included), fused by ncclGroupStart/End into one operation, as torch's ProcessGroupNCCL
  // builds all_to_all_single with split sizes (torch/csrc/cuda/nccl.cpp, all2all_single_unequal_split).
  WorkPtr all_to_all_async(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) override {
    check_tensor(in, "all_to_all");
    check_tensor(out, "all_to_all");
    const auto split = check_all_to_all(name_, rank_, size_, in, out, send_counts, recv_counts);
    Staging s(device_);
    const auto din = s.stage(in, Flow::In), dout = s.stage(out, Flow::Out);
    const ncclDataType_t type = nccl_type(din);
    const size_t esize = din.element_size();
    auto* send_base = static_cast<char*>(din.data_ptr());
    auto* recv_base = static_cast<char*>(dout.data_ptr());
    return launch("all_to_all", in, -1, std::move(s), false, [&](cudaStream_t stream) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (int p = 0; p < size_; ++p) {
        if (split.send_elements[p] > 0)
          nccl_check(ncclSend(send_base + split.send_offsets[p] * esize, static_cast<size_t>(split.send_elements[p]),
                              type, p, comm_, stream),
                     "ncclSend (all_to_all)");
        if (split.recv_elements[p] > 0)
          nccl_check(ncclRecv(recv_base + split.recv_offsets[p] * esize, static_cast<size_t>(split.recv_elements[p]),
                              type, p, comm_, stream),
                     "ncclRecv (all_to_all)");
      }
      return ncclGroupEnd();
    }, ", sending " + counts_text(send_counts) + " rows, receiving " + counts_text(recv_counts) + " rows");
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    if (color < 0) fail("split: color must be >= 0, got ", color);
    auto members = split_members(color, key);
    ncclComm_t child = nullptr;
    {
      c10::cuda::CUDAGuard guard(device_.index());
      nccl_check(ncclCommSplit(comm_, color, key, &child, nullptr), "ncclCommSplit");
    }
    const std::string prefix = prefix_ + name + "." + std::to_string(color) + "#" + std::to_string(splits_++) + "/";
    auto c = std::make_shared<NcclCommunicator>(child, device_.index(), store_, prefix, name, std::move(members));
    c->set_timeout_seconds(timeout_s_);
    return c;
  }

  void add_wait_time(const std::string& op, double s) {
    stats_[op].wait_seconds += s;
    collect_inflight_times();
  }
  c10::DeviceIndex device_index() const { return device_.index(); }

 private:
  void check_tensor(const at::Tensor& t, const char* op) const {
    if (!t.is_contiguous()) fail("communicator: ", op, " needs a contiguous tensor");
    if (!t.device().is_cpu() && t.device() != device_)
      fail("communicator '", name_, "': ", op, " got a tensor on ", t.device(), "; this NCCL communicator runs on ",
           device_, " (it also takes CPU tensors, staged through the device)");
    nccl_type(t);
  }

  // Queues `call` (one NCCL operation) on the communication stream after the work already on the
  // caller's current stream, and registers it with the watchdog. `t` (undefined for a barrier)
  // gives the operation's size for the stats and the timeout message.
  // `extra` is appended to the operation's detail in a timeout message.
  template <typename Call>
  WorkPtr launch(const std::string& op, const at::Tensor& t, int peer, Staging staging, bool barrier,
                 Call call, const std::string& extra = "") {
    collect_inflight_times();
    const int64_t bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    auto& s = stats_[op];
    s.calls++;
    s.bytes += bytes;
    auto flight = std::make_shared<InFlight>(op, t.defined() ? operation_detail(op, t, peer) + extra : "", ++seq_,
                                             peer, timeout_s_);
    flight->recorder = flight_recorder().begin(channel_, seq_, op, t.defined() ? &t : nullptr, peer);
    c10::cuda::CUDAGuard guard(device_.index());
    follow_caller_stream();
    nccl_check(call(stream_.stream()), "nccl " + op);
    for (const auto& used : staging.used())
      c10::cuda::CUDACachingAllocator::recordStream(used.storage().data_ptr(), stream_);
    flight->done.record(stream_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_.push_back(flight);
    }
    const bool host_blocking = barrier || staging.copied();
    return std::make_shared<NcclWork>(this, std::move(flight), std::move(staging), host_blocking);
  }

  void follow_caller_stream() {
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(stream_);
  }

  // Moves the in-flight time of finished operations into stats_, which only this (the caller's)
  // thread touches; the watchdog only marks operations finished.
  void collect_inflight_times() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<InFlight>> running;
    for (auto& f : inflight_) {
      if (auto s = f->inflight_seconds()) stats_[f->op].inflight_seconds += *s;
      else running.push_back(f);
    }
    inflight_.swap(running);
  }

  // World ranks of this rank's group after split(color, key), in the group's rank order (by key,
  // then rank here: MPI_Comm_split's order, which ncclCommSplit follows). Gathering them first is
  // also a timed meeting: a rank that never calls split is reported, where ncclCommSplit would hang.
  std::vector<int> split_members(int color, int key) {
    const auto mine = at::tensor(std::vector<int64_t>{color, key, world_ranks_[rank_]});
    auto all = at::empty({3 * size_}, at::kLong);
    all_gather(mine, all);
    const auto a = all.accessor<int64_t, 1>();
    std::vector<std::pair<int64_t, int>> order;  // (key, rank here)
    for (int p = 0; p < size_; ++p)
      if (a[3 * p] == color) order.emplace_back(a[3 * p + 1], p);
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    for (const auto& [k, p] : order) members.push_back(static_cast<int>(a[3 * p + 2]));
    return members;
  }

  // Waits until every operation launched here has finished, so that destroying the communicator
  // cannot cut one short (the watchdog still ends the process on a timeout). False on a CUDA error.
  bool drain() {
    try {
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (std::all_of(inflight_.begin(), inflight_.end(), [](const auto& f) { return f->poll(); })) return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (const std::exception&) {
      return false;
    }
  }

  // ---- watchdog thread ----

  void watch() {
    // A new thread's current device is 0: without this, querying events would create a context
    // on GPU 0 in every rank whose GPU is another one.
    c10::cuda::CUDAGuard guard(device_.index());
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; })) {
      std::shared_ptr<InFlight> late;
      try {
        for (const auto& f : inflight_)
          if (!f->poll() && seconds_since(f->launched) > f->timeout_s) {
            late = f;
            break;
          }
      } catch (const std::exception& e) {
        abort_and_exit(failure_message(std::string("CUDA error while watching operations: ") + e.what()));
      }
      if (late) {
        lock.unlock();  // the caller's thread may keep launching while the survey runs
        timeout_exit(*late);
      }
      check_async_error();
    }
  }

  // "shardlm: rank R of communicator 'N' (world rank W): <what>; in flight: <oldest>. Exiting."
  // Called with mu_ held.
  std::string failure_message(const std::string& what) const {
    std::string oldest = "nothing";
    if (!inflight_.empty()) {
      const auto& f = *inflight_.front();
      oldest = f.op + f.detail + " (operation #" + std::to_string(f.seq) + ")";
    }
    return rank_prefix(rank_, name_, world_ranks_[rank_]) + what + "; in flight: " + oldest + ". Exiting.\n";
  }

  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) return;
    abort_and_exit(failure_message(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async) +
                                   " (" + ncclGetLastError(comm_) + ")"));
  }

  [[noreturn]] void timeout_exit(const InFlight& f) {
    const double waited = seconds_since(f.launched);
    auto& recorder = flight_recorder();
    recorder.fail(f.recorder);
    recorder.request_dumps();  // the peers write theirs during the survey below
    recorder.dump(flight_timeout_reason(f.op, f.seq, name_));
    const std::set<int> heard =
        f.peer < 0 ? survey_stuck_ranks(store_, prefix_, rank_, size_, f.seq, stuck_grace_seconds(f.timeout_s))
                   : std::set<int>{};
    const PeerSplit peers = split_peers(rank_, size_, f.peer, heard);
    std::vector<int> missing;
    for (int p : peers.missing) missing.push_back(world_ranks_[p]);
    recorder.dump(flight_timeout_reason(f.op, f.seq, name_, &missing));  // now naming whom it waited for
    abort_and_exit(timeout_message({rank_, name_, world_ranks_, f.op, f.detail, waited, f.seq, peers}),
                   /*record=*/false);  // the record above says more than the message
  }

  // record: write the flight record with the message as its reason first.
  [[noreturn]] void abort_and_exit(const std::string& message, bool record = true) {
    if (record) flight_recorder().dump("communication failure: " + message);
    write_failure(message);
    // ncclCommAbort stops this communicator's kernels; should it hang itself, exit anyway.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(kCommFailureExitCode);
    }).detach();
    ncclCommAbort(comm_);
    std::_Exit(kCommFailureExitCode);
  }

  ncclComm_t comm_;
  c10::Device device_;
  c10::cuda::CUDAStream stream_;
  StorePtr store_;      // side channel shared with the communicators split from this one
  std::string prefix_;  // this communicator's keys in store_
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
  int64_t seq_ = 0;
  FlightChannel channel_;  // guarded by mu_ of the flight recorder
  int splits_ = 0;
  std::mutex mu_;  // guards inflight_ and stopping_
  std::vector<std::shared_ptr<InFlight>> inflight_;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread watchdog_;  // last: starts once everything above exists
};

void NcclWork::wait() {
  const auto t0 = Clock::now();
  if (host_blocking_) {
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  } else {
    flight_->done.block(c10::cuda::getCurrentCUDAStream(comm_->device_index()));
  }
  comm_->add_wait_time(flight_->op, seconds_since(t0));
}

// The ranks' shared steps once a bootstrap channel exists: one rank per GPU, one ncclUniqueId,
// then ncclCommInitRank on this rank's device.
CommPtr connect(const AllGather& gather, int rank, int size, const std::vector<GpuIdentity>& gpus, StorePtr store,
                const std::string& prefix) {
  const int device_index = gpus[rank].device_index;
  const ncclUniqueId id = agree_unique_id(gather, rank);
  ncclComm_t comm = nullptr;
  {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
    nccl_check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  }
  std::vector<int> world_ranks(size);
  for (int r = 0; r < size; ++r) world_ranks[r] = r;
  return std::make_shared<NcclCommunicator>(comm, device_index, std::move(store), prefix + "world/", "world",
                                            std::move(world_ranks));
}

}  // namespace

bool nccl_available() { return true; }

CommPtr nccl_world(const CommPtr& bootstrap, int device_index) {
  if (!bootstrap) fail("nccl_world needs a bootstrap communicator (e.g. mpi_world()) to share the ncclUniqueId");
  require_cuda_device(device_index);
  const auto gather = gather_over(bootstrap);
  const auto gpus = gather_gpus(gather, device_index);
  auto store = side_channel_store(gather, bootstrap->rank(), gpus);
  return connect(gather, bootstrap->rank(), bootstrap->size(), gpus, std::move(store), "shardlm/");
}

CommPtr nccl_world_from_env(int device_index) {
  const TorchrunEnv env = torchrun_env();
  require_cuda_device(device_index);
  auto store = open_tcp_store(env.master_addr, env.master_port, env.rank == 0 && !agent_hosts_store());
  const std::string prefix = torchrun_key_prefix();
  const auto gather = gather_over(store, prefix, env.rank, env.world_size);
  const auto gpus = gather_gpus(gather, device_index);
  return connect(gather, env.rank, env.world_size, gpus, std::move(store), prefix);
}

#else  // built without NCCL

namespace {
[[noreturn]] void no_nccl() {
  fail("this shardlm was built without NCCL; CMake found no nccl.h and libnccl.so.2 (it looks in the torch "
       "wheel's nvidia/nccl package, then the CUDA toolkit). Rebuild against the CUDA build of torch, or use "
       "comm.backend=mpi");
}
}  // namespace

bool nccl_available() { return false; }
CommPtr nccl_world(const CommPtr&, int) { no_nccl(); }
CommPtr nccl_world_from_env(int) { no_nccl(); }

#endif
}  // namespace shardlm::comm
