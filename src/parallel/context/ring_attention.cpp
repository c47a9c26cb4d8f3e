// See ring_attention.h.
#include "parallel/context/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

#include "parallel/context/chunks.h"

namespace shardlm::parallel::context {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A masked score: finite, so a query row that sees nothing of a block gets a finite (and, after the
// merge, zero-weighted) partial result instead of NaN, in forward and in backward.
constexpr double kHidden = -1e30;

// One hop of the ring. Forward: starts sending kv (contiguous; the caller keeps it alive) to the
// next rank and receiving the previous rank's block into the returned buffer, whose contents are
// valid once the handles left in *pending are waited on. Backward: the received block's gradient
// goes back to the rank it came from (send to the previous rank, receive from the next), which
// adds it to its own block's gradient.
struct RingHop : torch::autograd::Function<RingHop> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& kv, comm::Communicator* group,
                            std::vector<comm::WorkPtr>* pending) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    const int r = group->rank(), c = group->size();
    auto out = at::empty_like(kv);
    pending->push_back(group->send_async(kv, (r + 1) % c, /*tag=*/43));
    pending->push_back(group->recv_async(out, (r + c - 1) % c, /*tag=*/43));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& group = *reinterpret_cast<comm::Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const int r = group.rank(), c = group.size();
    const auto grad = g[0].contiguous();
    auto out = at::empty_like(grad);
    auto sent = group.send_async(grad, (r + c - 1) % c, /*tag=*/44);
    group.recv_async(out, (r + 1) % c, /*tag=*/44)->wait();
    sent->wait();
    return {out, {}, {}};
  }
};

at::Tensor repeat_heads(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), kv = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, T, D}).reshape({B, kv * n_rep, T, D});
}

struct Partial {
  at::Tensor out, lse;  // [B, H, rows, D] and [B, H, rows, 1] in the merge's dtype
};

// Softmax attention of q over one block of keys (bool mask `blocked`, true = hidden), as a partial result.
Partial block_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& blocked,
                        at::ScalarType math) {
  const double scale = std::pow(static_cast<double>(q.size(3)), -0.5);
  const int64_t n_rep = q.size(1) / k.size(1);
  auto scores = (at::matmul(q, repeat_heads(k, n_rep).transpose(2, 3)) * scale).to(math).masked_fill(blocked, kHidden);
  const auto lse = at::logsumexp(scores, {-1}, /*keepdim=*/true);
  const auto probs = at::softmax(scores, -1);
  return {at::matmul(probs, repeat_heads(v, n_rep).to(math)), lse};
}

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& group,
                          int64_t window, const at::Tensor& segments, const at::Tensor& all_segments) {
  const int c = group.size(), r = group.rank();
  const int64_t t = q.size(2), half = t / 2, T = t * c;
  const auto math = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto q_pos = chunk_positions(T, c, r, q.device());
  auto kv = at::stack({k, v}).contiguous();  // one message per hop: [2, B, KV, t, D]
  std::vector<Partial> parts;
  for (int s = 0; s < c; ++s) {
    const int src = (r + c - s) % c;  // whose block kv is
    std::vector<comm::WorkPtr> pending;
    at::Tensor next;
    if (s + 1 < c) next = RingHop::apply(kv, &group, &pending);
    const auto k_pos = chunk_positions(T, c, src, q.device());
    const auto k_seg = all_segments.defined() ? all_segments.narrow(1, src * t, t) : at::Tensor();
    // Which queries and keys can meet (causally): all of both for the own block; the block's first
    // chunk for an earlier rank's; this rank's second chunk for a later rank's.
    const int64_t q0 = src > r ? half : 0, k_len = src < r ? half : t;
    const auto qs = q.narrow(2, q0, t - q0);
    const auto q_seg = segments.defined() ? segments.narrow(1, q0, t - q0) : at::Tensor();
    const auto blocked = blocked_between(q_pos.narrow(0, q0, t - q0), k_pos.narrow(0, 0, k_len), window, q_seg,
                                         k_seg.defined() ? k_seg.narrow(1, 0, k_len) : at::Tensor());
    auto part = block_attention(qs, kv[0].narrow(2, 0, k_len), kv[1].narrow(2, 0, k_len), blocked, math);
    if (q0 > 0) {  // the first chunk's queries saw nothing of this block
      part.out = at::cat({at::zeros_like(part.out), part.out}, 2);
      part.lse = at::cat({at::full_like(part.lse, kHidden), part.lse}, 2);
    }
    parts.push_back(part);
    for (auto& w : pending) w->wait();
    if (next.defined()) kv = next;
  }
  std::vector<at::Tensor> lses;
  for (const auto& p : parts) lses.push_back(p.lse);
  const auto total = at::logsumexp(at::stack(lses), {0});
  at::Tensor out;
  for (const auto& p : parts) {
    const auto term = at::exp(p.lse - total) * p.out;
    out = out.defined() ? out + term : term;
  }
  return out.to(q.scalar_type());
}

}  // namespace shardlm::parallel::context
