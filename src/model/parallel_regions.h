// Where a tensor-parallel strategy may communicate inside the model's forward. The model marks the
// edges of its parallel regions (Megatron-LM's f and g) and the places it reads a weight, embeds
// tokens or computes the loss, and knows nothing about what happens there: without a strategy
// (nullptr) every one of these is the plain single-process computation.
//
// A decoder layer, as the model runs it:
//   x -> norm -> enter -> q/k/v (column products) -> attention -> o (row product) -> leave -> + x
//     -> norm -> enter -> gate/up (column)       -> SiLU * up  -> down (row)      -> leave -> + x
// A sparse (mixture-of-experts) layer's second half is no region: norm -> MoE block -> + x on the
// residual stream's layout, its weights replicated (their gradients summed where the sequence is split).
// The local number of heads and the MLP width are read from the weights' shapes, so a strategy
// that hands the model shards of q/k/v/gate/up by rows and o/down by columns gets a layer that
// computes this rank's part of every product.
#pragma once
#include <ATen/core/Tensor.h>

namespace shardlm::model {

class ParallelRegions {
 public:
  virtual ~ParallelRegions() = default;
  // Before the column-parallel products: the residual stream's layout -> a full input on every rank.
  virtual at::Tensor enter(const at::Tensor& x) = 0;
  // After a row-parallel product (and after the embedding lookup): partial sums -> the residual
  // stream's layout.
  virtual at::Tensor leave(const at::Tensor& partial) = 0;
  // Parameter `param` (index into Llama::parameters()) as the forward reads it.
  virtual at::Tensor weight(size_t param, const at::Tensor& w) = 0;
  // The token embedding lookup, as partial sums that leave() completes.
  virtual at::Tensor embed(const at::Tensor& weight, const at::Tensor& ids) = 0;
  // Mean cross-entropy from the head's output and the targets.
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) = 0;
  // Summed cross-entropy over the targets other than -100 (model::kIgnoredTarget).
  virtual at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& targets) = 0;
  // Sums that each rank holds for its own positions (the load-balancing loss's, model/moe.h) ->
  // the sums over the whole sequence on every rank; backward identity (every rank computes the same
  // loss from them). The identity where each rank holds every position.
  virtual at::Tensor sum_over_sequence(const at::Tensor& partial) { return partial; }
};

}  // namespace shardlm::model
