// The autograd-aware all_to_all of expert parallelism (MoE token dispatch and combine): tokens are
// rows, and each rank sends rows to the ranks that hold their experts. The communicator stays
// beneath (comm/communicator.h: all_to_all_async with per-rank counts); this is the one place its
// gradient is defined.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel::expert {

// How many rows every peer sends this rank, from how many this rank sends each peer: an all_to_all
// of one count per rank (rank j's send_counts[i] becomes rank i's result[j]). Collective.
std::vector<int64_t> exchange_counts(comm::Communicator& group, const std::vector<int64_t>& send_counts);

// Forward: all_to_all of x's rows (dim 0) over `group`: send_counts[j] consecutive rows to rank j
// (rank 0's first), recv_counts[j] rows from rank j, concatenated in rank order; returns a new
// tensor of sum(recv_counts) rows shaped like x otherwise.
// Backward: the gradient goes back the way the rows came: all_to_all of the output's gradient with
// the counts transposed (recv_counts as the send counts, send_counts as the receive counts), so
// every row's gradient lands on the rank and position it was sent from. Collective in both
// directions: every rank of `group` must call it, and run backward through it, in the same order.
// `group` must outlive the backward pass.
at::Tensor all_to_all(const at::Tensor& x, comm::Communicator& group, const std::vector<int64_t>& send_counts,
                      const std::vector<int64_t>& recv_counts);

}  // namespace shardlm::parallel::expert
