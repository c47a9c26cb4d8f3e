// Megatron-LM's tensor-parallel layout of a Llama, as data: which parameter is split along which
// dimension, what each of t ranks holds, and how the pieces join back into the HF tensor. The
// planner reads it for models it never allocates; apply_tensor_parallel (tensor_parallel.h) for
// the model it trains; export joins the pieces with it.
//   embed_tokens, lm_head   vocab-parallel: rank r holds vocabulary rows [r V'/t, (r+1) V'/t) of
//                           the vocabulary padded with zero rows to V' = a multiple of t (Megatron's
//                           make-vocab-size-divisible-by, with the divisor t): no token id reaches
//                           the padding, the loss masks its logits, and joining the pieces drops it,
//                           so checkpoints reshard and export to the HF shape [V, hidden]
//   q_proj, gate/up_proj    column-parallel: the rows of this rank's heads / MLP columns
//   k_proj, v_proj          column-parallel over KV heads; when t exceeds the KV heads (t a multiple
//                           of them), each KV head is replicated on the t/KV ranks whose query
//                           heads read it, as Megatron does, and its gradient is summed over them
//   o_proj, down_proj       row-parallel: the columns that multiply this rank's part
//   *norm.weight            replicated (with sequence parallelism their gradients are partial
//                           and summed over the tensor-parallel group); Qwen3's per-head q_norm /
//                           k_norm always (each rank normalises only its heads)
//   MoE router, experts,    replicated: the sparse block runs outside the regions on the residual
//   shared expert           stream's layout (every position without sequence parallelism; this
//                           rank's positions, gradients summed like the norms', with it)
//   q/k/v, gate/up biases   split with their product's output rows, like the weight
//   o_proj, down_proj bias  replicated, added once after the row-parallel sum (with sequence
//                           parallelism to this rank's positions: partial gradients, summed)
//   LoRA's lora_A, lora_B   with their base linear: a column-parallel base keeps lora_A whole (its
//                           gradient partial over the output rows: summed) and splits lora_B's rows
//                           like the base's (KV rows included); a row-parallel base splits lora_A's
//                           columns and keeps lora_B whole (the r-wide x A^T summed by the region's
//                           leave(); with sequence parallelism lora_B's gradient is partial, summed)
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "model/llama_config.h"

namespace shardlm::model {
struct ModelShape;
}

namespace shardlm::parallel::tp {

enum class Split { Replicated, Rows, Columns, KvRows };

struct ParamSplit {
  Split split = Split::Replicated;
  // Ranks holding the same values of this parameter (1: a true shard; t: replicated; t/KV:
  // replicated KV heads). The gradient norm counts each copy once: weight 1/replicas.
  int replicas = 1;
  // Whether the ranks' gradients are partial and must be summed over the copies: replicated KV
  // heads always, norm weights under sequence parallelism.
  bool sum_gradients = false;
};

// The split of an HF-named parameter at tensor-parallel size t.
ParamSplit param_split(const std::string& name, const model::LlamaConfig& cfg, int t, bool sequence_parallel);

// Refuses a layout Megatron's split cannot make, showing the arithmetic: t must divide the query
// heads and the MLP width, leave the last rank a vocabulary row, and divide or be a multiple of the KV heads; with
// sequence parallelism it must divide the sequence length.
void check_tensor_parallel(const model::LlamaConfig& cfg, int t, bool sequence_parallel, int64_t seq_len);

// The vocabulary padded to a multiple of t, and the rows of it each rank holds.
int64_t padded_vocab(const model::LlamaConfig& cfg, int t);
int64_t vocab_rows_per_rank(const model::LlamaConfig& cfg, int t);

// The shapes each rank holds (every rank's are equal).
model::ModelShape sharded_shape(const model::ModelShape& full, const model::LlamaConfig& cfg, int t);

// Rank r's piece of a full HF tensor, and the HF tensor from the t pieces in rank order.
at::Tensor shard(const at::Tensor& full, const std::string& name, const model::LlamaConfig& cfg, int t, int r);
at::Tensor unshard(const std::vector<at::Tensor>& pieces, const std::string& name, const model::LlamaConfig& cfg);

}  // namespace shardlm::parallel::tp
