// Ring attention (context_parallel_mode "p2p", the default): the keys and values of every
// context-parallel rank travel around the ring of the group by send/recv, c - 1 hops, each hop
// started before the current block's attention and waited on after it (overlap). Each block gives
// a partial softmax (its output and log-sum-exp), merged in fp32 (fp64 for a fp64 model) by the
// log-sum-exp, so the result is softmax over every key the mask lets a query see. Backward is the
// second ring: the gradient of each received block goes back hop by hop to the rank it came from.
// Grouped-query attention sends the KV heads only. Under the balanced split (chunks.h) a block from
// an earlier rank is seen whole by half the keys (its first chunk) and one from a later rank only
// by this rank's second chunk, so only those halves are computed: every rank does the same work.
#pragma once
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace shardlm::parallel::context {

// q [B, H, t, D], k, v [B, KV, t, D] of this rank's positions (chunks.h); window as causal_attention;
// segments [B, t] (packed rows, else undefined) this rank's, all_segments [B, c t] every rank's in
// gathered order. Returns [B, H, t, D] in q's dtype. Collective over `group` in forward and backward.
// fused (attention "sdpa"): on CPU under a causal mask alone, each block runs through the library's
// flash kernel, which keeps no T x T scores, and the backward ring overlaps its sends with the next
// block's gradient; otherwise (windows, packed rows, CUDA) the blocks' scores are materialised.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& group,
                          int64_t window, const at::Tensor& segments, const at::Tensor& all_segments,
                          bool fused = false);

}  // namespace shardlm::parallel::context
