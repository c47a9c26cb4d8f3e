// Coalesced parameter refresh after the optimizer step (DeepSpeed's allgather_bucket_size): after
// every rank has updated its shards, the units whose full parameters persist (stages 1 and 2, and
// stage 3's persistent small units) are all-gathered in buckets instead of one collective each, so
// a model of many small units pays a few synchronizations per step, not one per unit.
//
// Consecutive units are grouped while the bucket's gathered size (ranks x the sum of their shards)
// stays within `cap` elements; a larger unit is gathered alone, straight into its own buffer (in
// place where its shard is a view of it, as below stage 3). A bucket's receive buffer holds every rank's shards side by
// side, in rank order; this rank packs its own into its row and gathers in place, and rank p's shard
// of unit u is copied from there to [p·S_u, (p+1)·S_u) of the unit. At most two buckets are in
// flight, so the transient buffers are bounded by about 2 x cap elements; they are allocated per step
// (the refresh runs once per step, not per micro-step) and returned to the allocator after it.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel {

class AllGatherBuckets {
 public:
  // shard_numel[u]: S_u, the elements of unit u each rank owns; 0 for a unit not refreshed.
  AllGatherBuckets(std::vector<int64_t> shard_numel, int64_t cap, comm::CommPtr dp);

  size_t buckets() const { return buckets_.size(); }
  // Gathers every refreshed unit u: shards[u] (S_u elements, this rank's; may be a view of flats[u])
  // from every rank into flats[u] ([ranks x S_u] elements, contiguous). Collective; returns when
  // every unit holds the gathered values.
  void gather(const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>& flats) const;

 private:
  struct Bucket {
    std::vector<size_t> units;
    int64_t numel = 0;  // sum of S_u: the send size; the receive size is ranks x this
  };
  std::vector<int64_t> shard_numel_;
  comm::CommPtr dp_;
  std::vector<Bucket> buckets_;
};

}  // namespace shardlm::parallel
