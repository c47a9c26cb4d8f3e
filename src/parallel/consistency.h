// Debug consistency checks (debug.consistency_interval = k): every k steps, the tensors that must be
// bit-identical on several ranks — gradients after the data-parallel reduction (what each replica is
// about to apply) and parameters after the update — are compared by an exact checksum of their
// bytes, with one small all-gather per group of replicas. A difference stops every rank of the job
// with one message naming the first differing tensor (HF name), the step, the group and the ranks.
// Which tensors are replicated where is the strategy's knowledge (Strategy::replicated_tensors).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel {

class Strategy;
struct ModelSplit;

// Tensors every rank of `group` holds identical copies of, in the same order on each rank.
struct ReplicaSet {
  std::string what;  // the group, for messages: "data-parallel", "tensor-parallel", "tied-embedding"
  comm::CommPtr group;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // HF name (with an element range for shards)
};

// Whether step `step` (1-based) is checked: interval k > 0 and step a multiple of k.
inline bool consistency_due(int64_t interval, int64_t step) { return interval > 0 && step % interval == 0; }

// Exact checksum of a tensor's bytes (dtype and shape included); equal iff bit-identical (up to
// 64-bit hash collisions).
uint64_t tensor_checksum(const at::Tensor& t);

// Compares the strategy's replicated gradients (after finish_gradients) or parameters (after step)
// at `step` (1-based). Every rank of `world` must call it; on a mismatch every rank throws the same
// Error. Returns the seconds it took (the metrics' debug_consistency_s). (Tests perturb a replica
// through the strategy's replicated_tensors: fault_injection.h.)
double check_consistency(Strategy& strategy, const comm::CommPtr& world, int64_t step, bool gradients);

// The replica sets of this rank's parameters under `split`: `tensors[i]` (undefined: not held) is
// parameter i's tensor or gradient; `data_parallel` adds them all to the data-parallel set over `dp`;
// tensors replicated over the whole TP group go to the tensor-parallel set, the tied embedding
// (index 0) on the first and last pipeline stage to the tied-embedding set. With expert
// parallelism the expert slices go to an expert-data-parallel set over `edp` instead of dp's.
std::vector<ReplicaSet> split_replica_sets(const ModelSplit& split, const comm::CommPtr& dp,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           bool data_parallel, const comm::CommPtr& edp = nullptr);

}  // namespace shardlm::parallel
