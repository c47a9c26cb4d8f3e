// The autograd-aware collectives of context parallelism, one small function each; each says what
// it does in forward and in backward. `group` is the context-parallel communicator (ParallelDims::
// cp_comm), whose ranks hold the chunks of the same sequences (chunks.h); every rank calls each op,
// and runs backward through it, in the same order.
#pragma once
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace shardlm::parallel::context {

// all_gather mode's exchange of keys or values [B, KV, t, D]. Forward: all-gather along the
// sequence (dim 2), every rank's t positions one after another (gathered_positions' order) ->
// [B, KV, c t, D]. Backward: reduce-scatter (sum) of the gradient along the sequence, so each rank
// receives the sum over every rank's queries of the gradient of its own keys and values.
at::Tensor gather_chunks(const at::Tensor& kv, comm::Communicator& group);

// No gradient: the same all-gather of x [B, t] (int64 sample ids of packed rows) -> [B, c t].
at::Tensor gathered(const at::Tensor& x, comm::Communicator& group);

// all_to_all mode (DeepSpeed-Ulysses), sequence split -> head split. Forward: x [B, h, t, D] (h a
// multiple of c) sends heads [j h/c, (j+1) h/c) of its t positions to rank j -> this rank's h/c
// heads over every rank's positions [B, h/c, c t, D] (gathered_positions' order). Backward: the
// inverse all_to_all (heads_to_sequence) of the gradient.
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& group);
// The inverse: y [B, h, c t, D] -> [B, c h, t, D], this rank's positions of every head. Backward:
// sequence_to_heads of the gradient.
at::Tensor heads_to_sequence(const at::Tensor& y, comm::Communicator& group);

}  // namespace shardlm::parallel::context
