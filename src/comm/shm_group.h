// Intra-node collectives through one shared-memory segment, for ranks of a communicator that all
// run on one machine (DeepSpeed's CPU SHM all-reduce, made non-blocking). OpenMPI's non-blocking
// collectives reach 0.15-0.35 x memcpy bandwidth on one node (libnbc's algorithms, a temporary
// buffer per call); here each rank copies its input into its slot of the segment, reduces the
// 1/n slice it owns straight from every rank's slot, and copies the others' results out — about
// two memcpys of the message per rank. The slots stay in the last-level cache; results of 4 MiB
// and more go to the caller's buffers with streaming stores, and the float sum runs in SSE
// registers (shm_reduce.h), so memory sees close to the least traffic a collective needs: every
// input read once, every output written once.
//
// Every operation is a state machine advanced by advance() without ever blocking: a step that
// needs the peers checks their arrival counters and returns false when they are not there yet, so
// the caller (the MPI communicator's wait loop) keeps its deadline, its backoff for oversubscribed
// cores and its report of missing ranks. Large messages run in rounds of a fixed slot size over
// two alternating slot sets, so a round's writes never race the previous round's reads and each
// round needs one arrival (all_gather, reduce_scatter) or two (all_reduce).
// all_to_all (per-rank counts) splits each rank's slot into one sub-slot per destination: a round
// moves the next sub-slot's worth of every piece, and the first round also publishes how many rounds
// this rank needs, so that all run the largest number (a rank knows only its own pieces' sizes).
// Operations of one group must be advanced in the order they were started, on every rank.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::comm::shm {

enum class Kind { AllReduce, ReduceScatter, AllGather, AllToAll };

// An all_to_all in bytes: rank j's piece of the input at send_offsets[j], send_bytes[j] long; the
// same for the output (recv_*).
struct AllToAllBytes {
  std::vector<int64_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
};

class Group;

// One collective in flight. The pointers must stay valid until advance() returned true.
class Op {
 public:
  Op(Group* g, Kind kind, at::ScalarType dtype, ReduceOp op, const void* in, void* out, int64_t count);
  // all_to_all.
  Op(Group* g, at::ScalarType dtype, const void* in, void* out, AllToAllBytes pieces);
  // Makes as much progress as the peers allow; true once the result is in `out`.
  bool advance();
  // Steps (copies, reductions) taken by every operation of this process so far: a waiter that
  // sees it move knows the peers are active and keeps polling instead of sleeping.
  static uint64_t steps_taken() { return steps_; }

 private:
  bool start_round();
  void finish_round();
  bool start_all_to_all_round();
  void finish_all_to_all_round();
  int64_t sub_slot_bytes() const;
  template <typename T> void reduce_slice();

  Group* g_;
  Kind kind_;
  at::ScalarType dtype_;
  ReduceOp op_;
  const char* in_;
  char* out_;
  int64_t count_;     // all_reduce: elements; reduce_scatter: output elements; all_gather: input elements
  int64_t elt_;
  bool stream_;       // the output is written with streaming stores (large outputs)
  int64_t pos_ = 0;   // first element (of count_) of the current round
  int64_t len_ = 0;   // elements in the current round
  int phase_ = 0;     // 0: before the round; 1: waiting for the copy-in arrival; 2: for the reduce arrival
  uint64_t target_ = 0;
  AllToAllBytes pieces_;     // all_to_all only
  int64_t round_ = 0;        // all_to_all: rounds done
  int64_t rounds_ = -1;      // all_to_all: rounds the group runs (known after the first)
  static inline uint64_t steps_ = 0;
};

class Group {
 public:
  // Collective over comm (an MPI_Comm passed as its handle). Returns nullptr when the ranks do not
  // all share this node's memory; `barrier` is a timed barrier of the same ranks.
  static std::unique_ptr<Group> create(void* mpi_comm, int rank, int size, const std::function<void()>& barrier);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Whether this group runs collectives of `dtype` (the element types with a kernel).
  static bool supports(at::ScalarType dtype);
  // SHARDLM_COMM_SHM=0 in the environment turns the shared-memory path off (OpenMPI's collectives
  // serve every operation, as before it existed): for comparisons and as an escape hatch.
  static bool enabled();

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  friend class Op;
  Group(int rank, int size, char* base, size_t bytes, int64_t slot_bytes);
  char* slot(int rank, int set) const;
  void arrive(uint64_t target);
  bool all_arrived(uint64_t target) const;
  // A word beside rank p's arrival counter, one per slot set: what an all_to_all's first round
  // publishes (the rounds it needs) with its arrival.
  std::atomic<int64_t>* word(int p, int set) const;

  int rank_, size_;
  char* base_;
  size_t bytes_;
  int64_t slot_bytes_;
  uint64_t arrivals_ = 0;  // this rank's arrivals so far (every rank counts the same sequence)
  uint64_t rounds_ = 0;    // rounds so far: the slot set of the next round is rounds_ % 2
};

}  // namespace shardlm::comm::shm
