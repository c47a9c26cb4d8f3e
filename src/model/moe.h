// The sparse mixture-of-experts block of Mixtral and Qwen2-MoE, as transformers 5 computes it
// (modeling_mixtral.py MixtralSparseMoeBlock / MixtralTopKRouter / MixtralExperts,
// modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock), and transformers' load-balancing loss
// (load_balancing_loss_func). It exists apart from llama.cpp because the expert compute is its own
// algorithm: instead of transformers' loop over experts (gather each expert's tokens, two products,
// index_add), the token-expert assignments are sorted by expert once and each of the two products
// is ONE grouped matrix product over all experts (at::_grouped_mm where it exists for the dtype:
// CUDA bf16 and CPU fp32/bf16/fp16; else one product per expert over contiguous slices of the
// sorted rows). Same math, same parameters: the experts are the fused tensors transformers 5 keeps
// in memory, gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I].
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::model {

struct LlamaConfig;
class ContextAttention;

// Context parallelism (model/context_attention.h): the rows of a sparse layer's input are this
// rank's two chunks of every sequence, `positions` (both chunks) per sequence. A capacity then counts
// over the whole sequences, in their token order (none: every position is here).
struct SequenceShards {
  ContextAttention* context = nullptr;
  int64_t positions = 0;
};

// How the experts' products are computed (the loop exists to measure the grouped path against it).
enum class ExpertCompute { Grouped, Loop };

// The routed experts' weights of one sparse layer and the optional shared expert (qwen2_moe).
struct MoeWeights {
  at::Tensor router;        // [E, H]  mlp.gate.weight
  at::Tensor gate_up;       // [E, 2I, H]  mlp.experts.gate_up_proj
  at::Tensor down;          // [E, H, I]   mlp.experts.down_proj
  at::Tensor shared_gate, shared_up, shared_down;  // [S, H], [S, H], [H, S]; undefined: none
  at::Tensor shared_expert_gate;                   // [1, H]
};

// The routed experts' products of one sparse layer: rows [M, H] sorted by expert, counts[e] of
// them for expert e (every expert of the layer, in order), through gate_up [e, 2I, H] and down
// [e, H, I] as SwiGLU: returns the experts' outputs [M, H], row by row, before the top-k weights.
// Two grouped products (grouped_linear below).
at::Tensor expert_products(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& gate_up,
                           const at::Tensor& down);

// Where a sparse layer's routed rows are computed. The model asks its dispatch (Llama::
// set_expert_dispatch), never a communicator: without one (nullptr) every expert is on this rank and
// expert_products runs them here; expert parallelism (parallel/expert/expert_dispatch.h) installs one
// that sends each row to the rank holding its expert and brings the outputs back. Router, top-k,
// capacity dropping, the weighting and the shared expert stay in moe_block either way.
class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  // As expert_products, except that counts covers all num_experts experts of the layer while
  // gate_up / down hold only the experts this rank keeps. Returns one output row per input row,
  // in the input's order. `layer` names the layer in errors.
  virtual at::Tensor experts(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& gate_up,
                             const at::Tensor& down, int64_t layer) = 0;
};

// x: [N, H] (the post-attention-norm hidden states, flattened). Returns the block's output [N, H]
// in x's dtype. router_logits (when not null) receives this layer's router logits [N, E] for the
// load-balancing loss. `layer` names the layer in errors (a router producing NaN or infinity).
// dispatch: where the routed rows are computed (nullptr: here, by `compute`). expert_counts (when
// not null) receives the assignments each expert computed [E] and the ones the capacity dropped
// (its last element), for the metrics. shards: context parallelism's split of the sequences.
at::Tensor moe_block(const at::Tensor& x, const MoeWeights& w, const LlamaConfig& cfg, int64_t layer,
                     at::Tensor* router_logits = nullptr, ExpertCompute compute = ExpertCompute::Grouped,
                     ExpertDispatch* dispatch = nullptr, std::vector<int64_t>* expert_counts = nullptr,
                     const SequenceShards& shards = {});

// transformers' load_balancing_loss_func without an attention mask over the router logits of every
// sparse layer of one forward: E * sum_e f_e * P_e, where f_e is the share of the top-k assignments
// (all layers together) that went to expert e and P_e the mean router probability of e over all
// layers' tokens. Differentiable through P only (the counts are not), as there.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k);
// The same in two halves, for layouts where each rank holds part of the rows (sequence shards,
// pipeline stages): the sums [F (E), S (E), rows] over the given logits, where F counts the top-k
// picks of each expert (no gradient) and S sums its router probabilities (with gradient), in float32
// (float64 for a float64 model); sums of several parts add element-wise. Then the loss from the
// sums of all rows: E / rows^2 * sum_e F_e * S_e.
at::Tensor load_balancing_sums(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k);
at::Tensor load_balancing_loss_from_sums(const at::Tensor& sums, int64_t num_experts);

// rows [N, K] sorted by group, groups given by their end offsets (int32 [E], cumulative); w
// [E, Nout, K]: row r of group e becomes rows[r] @ w[e]^T. One grouped product where supported.
at::Tensor grouped_linear(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& offsets,
                          const std::vector<int64_t>& ends);

// Expert weights as files hold them -> as the model holds them. save_pretrained (transformers 4 and
// 5) writes one tensor per expert: mixtral model.layers.L.block_sparse_moe.experts.N.w1/w2/w3.weight
// (gate, down, up) and block_sparse_moe.gate.weight; qwen2_moe model.layers.L.mlp.experts.N.
// {gate,up,down}_proj.weight. They are stacked into the fused tensors (gate_up = [w1; w3] per expert,
// transformers' MergeModulelist + Concatenate) and block_sparse_moe renamed mlp. Fused tensors (a
// transformers 5 state_dict) and every other name pass through. An expert missing from a layer that
// has some is reported in `problems` (one line each).
using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;
NamedTensorList fuse_expert_tensors(const LlamaConfig& cfg, const NamedTensorList& tensors,
                                    std::vector<std::string>& problems);
// The inverse, for Hugging Face files: fused expert tensors -> one tensor per expert under the names
// save_pretrained writes (mixtral: block_sparse_moe.*). Every other tensor passes through.
NamedTensorList split_expert_tensors(const LlamaConfig& cfg, const NamedTensorList& tensors);
// The same split as element ranges, for writers that stream tensors without holding them (the
// checkpoint export): parameter `name` of `shape` becomes these file tensors, each the `numel`
// contiguous elements from `begin` of the parameter. A tensor that is not split is one slice under
// its file name.
struct FileSlice {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
};
std::vector<FileSlice> hf_file_slices(const LlamaConfig& cfg, const std::string& name,
                                      const std::vector<int64_t>& shape);

}  // namespace shardlm::model
