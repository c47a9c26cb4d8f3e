// The load-balanced split of context parallelism, as arithmetic: every sequence of T positions is
// cut into 2c chunks of T / 2c and context-parallel rank i holds chunks i and 2c-1-i (in that
// order), so under a causal mask every rank attends over the same number of (query, key) pairs
// (torchtitan's and Megatron-Core's head-tail balancing). Each position keeps its place in the whole
// sequence: RoPE reads it, and the masks (causal, sliding window, the samples of packed rows) are
// computed from it, so a rank's chunks see exactly the keys one process would let them see.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace shardlm::parallel::context {

// The places in the sequence of rank `rank`'s positions: int64 [T / c], chunk rank then chunk 2c-1-rank.
at::Tensor chunk_positions(int64_t T, int c, int rank, const at::Device& device = at::kCPU);
// Every rank's positions one after another (rank 0's first): where the gathered positions sit, int64 [T].
at::Tensor gathered_positions(int64_t T, int c, const at::Device& device = at::kCPU);
// Rank `rank`'s part of x [B, T, ...] (dim 1 is the sequence): [B, T / c, ...], a new tensor.
at::Tensor split_sequence(const at::Tensor& x, int c, int rank);
// What queries at q_pos [Tq] may not see of keys at k_pos [Tk]: later keys, and with window > 0
// keys at or before q - window, and with segments (int64 [B, Tq] and [B, Tk], the sample each position
// belongs to in a packed row) keys of another sample. Bool [Tq, Tk], or [B, 1, Tq, Tk] with segments.
at::Tensor blocked_between(const at::Tensor& q_pos, const at::Tensor& k_pos, int64_t window,
                           const at::Tensor& q_segments = {}, const at::Tensor& k_segments = {});

}  // namespace shardlm::parallel::context
