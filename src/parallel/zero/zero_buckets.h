// Coalesced gradient reduce-scatters for ZeRO (DeepSpeed's reduce_bucket_size): consecutive units
// are grouped into buckets of at most `cap` elements, so one collective serves several small units
// instead of one each (every collective costs a few synchronizations whatever its size). Empty
// units (under a pipeline, the other stages' units) belong to no bucket: they never get gradients
// on this rank, and would keep their bucket from launching until the next flush.
//
// Which elements a rank owns does not change: unit u stays sharded as [p·S_u, (p+1)·S_u) for rank
// p. A bucket's send buffer is laid out rank-major, so that rank p's segment is the concatenation
// of its shards of the bucket's units:
//     [ u_a shard 0 | u_b shard 0 | ... ][ u_a shard 1 | u_b shard 1 | ... ] ...
// and the reduce-scatter hands rank p exactly its reduced shards, in unit order.
//
// Buffers are a small pool of (send, receive) pairs sized for the largest bucket, allocated the
// first time they are needed and reused for every later bucket and micro-step: a bucket takes a
// free pair, else waits for the oldest reduction in flight to land and takes its pair.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel {

class ReduceScatterBuckets {
 public:
  // Receives unit u's reduced shard (a view into a receive buffer, valid only during the call).
  using Deliver = std::function<void(size_t unit, const at::Tensor& reduced_shard)>;

  // shard_numel[u]: S_u, the elements of unit u each rank owns. cap: the most elements of one
  // bucket (its send buffer: ranks x the sum of its S_u); a unit larger than cap is a bucket alone.
  // send_rows and unit_ready accept empty units too (nothing to fill, nothing to reduce).
  ReduceScatterBuckets(std::vector<int64_t> shard_numel, int64_t cap, comm::CommPtr dp, at::TensorOptions buffer,
                       Deliver deliver);

  size_t buckets() const { return buckets_.size(); }
  // Unit u's place in its bucket's send buffer: [ranks, S_u], row p = rank p's shard of u. Fill it
  // completely (padding included), then call unit_ready(u).
  at::Tensor send_rows(size_t u);
  // Launches u's bucket's reduce-scatter once all its units are ready.
  void unit_ready(size_t u);
  // Launches buckets some of whose units never became ready this micro-step (units unused in this
  // forward): their rows are zeroed, so every rank issues the same collectives. Then completes.
  void flush();
  // Hands reductions that have landed (all: waits for every one) to `deliver`.
  void complete(bool all);

 private:
  struct Bucket {
    std::vector<size_t> units;   // consecutive non-empty units, in order
    int64_t numel = 0;           // sum of S_u: the receive size; the send size is ranks x this
    size_t pending = 0;          // units not ready yet
    int slot = -1;               // buffer pair in use, -1: none
  };
  static constexpr size_t kNoBucket = static_cast<size_t>(-1);  // an empty unit's bucket
  struct Slot {
    at::Tensor send, recv;
    int bucket = -1;             // -1: free
    comm::WorkPtr work;          // set once launched
    int64_t launched_order = 0;
  };
  int take_slot();
  void launch(size_t b);
  void finish(int slot);

  std::vector<int64_t> shard_numel_;
  comm::CommPtr dp_;
  at::TensorOptions buffer_;
  Deliver deliver_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // per unit; kNoBucket for empty units
  std::vector<int64_t> offset_;    // per unit: where its shard starts in its bucket's rank segment
  std::vector<char> ready_;  // per unit: filled in the bucket's current use
  std::vector<Slot> slots_;
  int64_t largest_ = 0;  // largest bucket's numel
  int64_t launches_ = 0;
};

}  // namespace shardlm::parallel
