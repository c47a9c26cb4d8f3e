// Applies Megatron tensor parallelism to a plain Llama: replaces each parameter by this rank's
// shard (tp_layout.h) and installs the parallel regions (tp_ops.h at the region edges, the
// vocab-parallel embedding and cross-entropy). No rank ever holds the full-vocabulary logits: the
// head produces this rank's V/t columns and the loss combines them with three small all-reduces
// (max, sum of exponentials, target logit) over the batch's positions.
//
// With LoRA (model/lora.h) the adapters are the parameters, split with their base linear (tp_layout.h),
// and the frozen base is sharded like the parameters it was.
//
// With sequence parallelism (Korthikanti et al. 2022) the residual stream, the norms and the
// residual additions hold [batch, seq/t, hidden] on each rank: a region is entered by an
// all-gather along the sequence and left by a reduce-scatter, the same bytes as the all-reduce
// they replace, and the activations outside the regions are divided by t.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/tensor/tp_layout.h"

namespace shardlm::parallel {

class TensorParallel {
 public:
  // Shards `model` (whose parameters must be the full, identical tensors on every rank of `tp`)
  // and installs the regions. The layout must have passed check_tensor_parallel.
  TensorParallel(model::Llama& model, comm::CommPtr tp, bool sequence_parallel);

  int size() const { return tp_->size(); }
  // "tp=2 x " or "tp=2 (sequence parallel) x ": how a strategy's description starts.
  std::string describe_prefix() const;
  // The KV-head groups' traffic, recorded as comm_tp_kv_<op>_* (none when KV heads are split).
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const;
  bool sequence_parallel() const { return sequence_parallel_; }
  const comm::CommPtr& group() const { return tp_; }
  // The ranks sharing each replicated KV head (tp > num_key_value_heads), else null.
  const comm::CommPtr& kv_group() const { return kv_group_; }
  // Per parameter: 1/replicas, the weight of its squared gradient norm in the whole model's norm
  // (replicated tensors counted once), before the sum over the tensor-parallel group.
  const std::vector<double>& grad_norm_weights() const { return norm_weights_; }
  // Full HF tensors (on the CPU) from every rank's shards: all ranks of tp take part, tensor-parallel
  // rank 0 gets them, the others get the names with undefined tensors. only (when not empty): the
  // parameters to join; the others pass through untouched.
  std::vector<std::pair<std::string, at::Tensor>> unshard(const std::vector<std::pair<std::string, at::Tensor>>& local,
                                                          const std::vector<char>& only = {}) const;

 private:
  comm::CommPtr tp_, kv_group_;
  model::LlamaConfig cfg_;
  bool sequence_parallel_;
  std::vector<double> norm_weights_;
};

}  // namespace shardlm::parallel
