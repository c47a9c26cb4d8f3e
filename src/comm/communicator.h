// The one interface every parallel strategy talks through. Backends (MPI: mpi_communicator.h, NCCL:
// nccl_communicator.h) implement it; strategies never see MPI or NCCL. Every call is also available
// async, with one of two completion semantics:
// - host-complete (MPI backend, any tensor; NCCL backend with CPU tensors, and its barrier): wait()
//   returns once the result is in the output tensor.
// - stream-ordered (NCCL backend with CUDA tensors): the operation starts after the work queued on
//   the caller's current CUDA stream; wait() makes that stream wait for the result and returns
//   without blocking the host, so later kernels on the stream see the result.
// Either way an operation is bounded by the communicator's timeout: a timeout names the operation,
// its size and the ranks that never arrived, then ends the process non-zero — a collective never
// waits forever.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace shardlm::comm {

enum class ReduceOp { Sum, Max, Min };

// Handle of an operation in flight. wait(): see the two semantics above.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Non-blocking: true once complete (the result is in the output tensor). Calling it also lets the
  // backend make progress.
  virtual bool test() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Per-operation totals, read by metrics and the run report.
struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;       // bytes this rank contributed (input size)
  // Host-side times. MPI: wait = the host blocked in wait() (exposed communication), in-flight =
  // launch to observed completion. NCCL on CUDA tensors: wait() does not block the host (~0), and
  // completion is observed when the host or the watchdog (every 50 ms) next polls, so in-flight
  // is an upper bound; GPU-side timing needs CUDA events or a profiler.
  double wait_seconds = 0;
  double inflight_seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // In place. Tensors must be contiguous, on the CPU or a CUDA device (MPI stages CUDA tensors through
  // host memory; NCCL takes its own device's tensors and stages CPU ones); float32/64, bf16, fp16,
  // int32/64 supported (and uint8/int8).
  virtual WorkPtr all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // input holds size()*n elements; output (n elements) receives this rank's reduced chunk.
  virtual WorkPtr reduce_scatter_async(const at::Tensor& input, const at::Tensor& output,
                                       ReduceOp op = ReduceOp::Sum) = 0;
  // input holds n elements; output (size()*n) receives every rank's input in rank order. The input
  // may be this rank's own chunk of the output (in place, as NCCL and MPI_IN_PLACE allow).
  virtual WorkPtr all_gather_async(const at::Tensor& input, const at::Tensor& output) = 0;
  virtual WorkPtr broadcast_async(const at::Tensor& tensor, int root) = 0;
  virtual WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) = 0;
  virtual WorkPtr barrier_async() = 0;
  // all_to_all with per-rank counts (MPI_Alltoallv; torch's all_to_all_single with split sizes), for
  // expert parallelism. Counts are rows: slices along dim 0 of input and output, whose remaining
  // dims must hold the same number of elements. This rank sends send_counts[j] consecutive rows of
  // input (rank 0's first) to rank j and receives recv_counts[j] rows from rank j into output, in
  // rank order; zeros are allowed. Both vectors have size() entries, summing to input.size(0) and
  // output.size(0). Rank i's send_counts[j] must equal rank j's recv_counts[i] (a receiver usually
  // learns its counts from a first all_to_all of the send counts: parallel/expert/all_to_all_ops.h);
  // the backends cannot see the peers' counts, debug.check_collectives compares them. input and
  // output must not overlap. The default builds it from send_async/recv_async (for decorators);
  // the backends override it with their library's collective.
  virtual WorkPtr all_to_all_async(const at::Tensor& input, const at::Tensor& output,
                                   const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts);

  void all_reduce(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void all_gather(const at::Tensor& in, const at::Tensor& out) { all_gather_async(in, out)->wait(); }
  void broadcast(const at::Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const at::Tensor& t, int dst, int tag = 0) { send_async(t, dst, tag)->wait(); }
  void recv(const at::Tensor& t, int src, int tag = 0) { recv_async(t, src, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }
  void all_to_all(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& send_counts,
                  const std::vector<int64_t>& recv_counts) {
    all_to_all_async(in, out, send_counts, recv_counts)->wait();
  }

  // Ranks with the same color form a new communicator, ordered by key (MPI_Comm_split semantics).
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  void set_timeout_seconds(double s) { timeout_s_ = s; }
  double timeout_seconds() const { return timeout_s_; }
  // Virtual so a decorator (checked_communicator.h) can report its wrapped backend's totals.
  virtual const std::map<std::string, OpStats>& stats() const { return stats_; }
  virtual void reset_stats() { stats_.clear(); }

 protected:
  double timeout_s_ = 300.0;
  std::map<std::string, OpStats> stats_;
};
using CommPtr = std::shared_ptr<Communicator>;

}  // namespace shardlm::comm
