// Where context parallelism reaches into the model's attention. Under context parallelism
// (parallel/context/) each rank holds only some positions of every sequence (its chunks); the
// model computes q, k, v and RoPE for those positions as usual and asks its context attention for
// softmax(QK^T/sqrt(d))V over the whole sequence, never a communicator. Without one (nullptr) every
// position is here and causal_attention (model/attention.h) runs. A mixture-of-experts layer asks it
// too, for what counts over the whole sequence: the load-balancing loss's sums and the capacity's
// token order (model/moe.h).
#pragma once
#include <ATen/core/Tensor.h>

#include "model/attention.h"

namespace shardlm::model {

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // The position in the whole sequence of each of this rank's `local` positions: int64 [local] on
  // `device`. RoPE reads them (unpacked rows; packed rows bring their own positions) and the masks
  // are computed from them.
  virtual at::Tensor positions(int64_t local, const at::Device& device) const = 0;
  // q: [B, H, t, D]; k, v: [B, KV, t, D] for this rank's t positions; window and segments (int64
  // [B, t], this rank's positions' samples, or undefined) as causal_attention takes them. Returns
  // this rank's [B, H, t, D]: each query attends to the keys of the whole sequence that
  // causal_attention would let it see.
  virtual at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Attention impl,
                               int64_t window, const at::Tensor& segments) = 0;
  // How many ranks hold the positions of each sequence (c).
  virtual int ranks() const = 0;
  // Sums each rank holds for its own positions (the load-balancing loss's [F, S, rows]) -> the sums
  // over the whole sequence, on every rank. Backward: the gradient summed over the ranks (each
  // rank's loss holds the same term, and the ranks' gradients are averaged).
  virtual at::Tensor sum_over_sequence(const at::Tensor& partial) = 0;
  // counts: int64 [B, 2, E], the top-k assignments to each expert in this rank's two chunks of each
  // row. Returns, same shape, the assignments to that expert of the positions before each chunk in
  // the whole row (every rank's chunks, in sequence order): where a capacity starts counting them.
  virtual at::Tensor assignments_before(const at::Tensor& counts) = 0;
};

}  // namespace shardlm::model
