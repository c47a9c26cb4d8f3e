// The autograd-aware collectives of tensor parallelism, one small function each (Megatron-LM's
// mappings.py). Each says what it does in forward and in backward; the strategy places them at
// the edges of the model's parallel regions (model/parallel_regions.h). `group` is the tensor-
// parallel communicator (or a sub-group of it); shapes are [batch, seq, ...] and the sequence-
// parallel ops split and join along dim 1.
#pragma once
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace shardlm::parallel::tp {

// f: forward identity; backward all-reduce (sum) of the gradient over `group`. Marks where a
// replicated tensor enters a column-parallel product (each rank's product sees only part of the
// output, so the input's gradient is the sum of the ranks' parts). Also used on a replicated
// weight whose gradient each rank computes only part of (sequence-parallel norms, replicated KV heads).
at::Tensor copy_to_region(const at::Tensor& x, comm::Communicator& group);

// g: forward all-reduce (sum) over `group`; backward identity. Completes the partial sums of a
// row-parallel product (and of the vocab-parallel embedding and loss).
at::Tensor reduce_from_region(const at::Tensor& x, comm::Communicator& group);

// Sequence parallelism's f: forward all-gather along the sequence (dim 1), backward
// reduce-scatter of the gradient along the sequence.
at::Tensor gather_sequence(const at::Tensor& x, comm::Communicator& group);

// Sequence parallelism's g: forward reduce-scatter (sum) along the sequence, backward all-gather.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, comm::Communicator& group);

// No gradient: the element-wise maximum over `group` (a new tensor).
at::Tensor all_reduce_max(const at::Tensor& x, comm::Communicator& group);

}  // namespace shardlm::parallel::tp
