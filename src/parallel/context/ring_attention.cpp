// See ring_attention.h.
#include "parallel/context/ring_attention.h"

#include <ATen/ATen.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// The fused ring (attention "sdpa" on CPU, a causal mask only): each block through the library's
// flash kernel, which returns the block's output and log-sum-exp and keeps no scores. Forward: the
// ring of K/V blocks as above, merged by the log-sum-exp; it keeps q, the blocks it saw, the merged
// output and log-sum-exp. Backward: the flash kernel's backward of each block given the MERGED output
// and log-sum-exp (it recomputes the block's probabilities as exp(s - lse), so with the final lse
// they are the block's share of the whole softmax and its dq, dk, dv are exact, as ring-flash-attention
// computes them); the blocks' dK/dV travel back around the ring, block s's gradient sent on while
// block s-1's is computed (overlapped).
// SHARDLM_CP_TIMING=1 (bench/context_parallel.py): the seconds this process spent in the fused
// ring's block kernels, forward and backward, printed at exit, so the balanced split's ranks can be
// compared. Off: nothing is timed.
struct KernelClock {
  bool on = std::getenv("SHARDLM_CP_TIMING") != nullptr;
  int rank = -1;
  double seconds = 0;
  ~KernelClock() {
    if (on && rank >= 0) std::fprintf(stderr, "[cp timing] rank %d: attention compute %.6f s\n", rank, seconds);
  }
};
KernelClock& kernel_clock() {
  static KernelClock clock;
  return clock;
}
// Runs f, adding its wall time to the clock when on.
template <class F>
auto timed(int rank, F&& f) {
  auto& clock = kernel_clock();
  if (!clock.on) return f();
  const auto start = std::chrono::steady_clock::now();
  auto out = f();
  clock.rank = rank;
  clock.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

struct BlockShape {
  int src;
  int64_t q0, k_len;  // queries [q0, t) meet keys [0, k_len) of the block (see ring_attention)
};

BlockShape block_shape(int s, int r, int c, int64_t t) {
  const int src = (r + c - s) % c;
  return {src, src > r ? t / 2 : 0, src < r ? t / 2 : t};
}

struct RingFlash : torch::autograd::Function<RingFlash> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            comm::Communicator* group) {
    const int c = group->size(), r = group->rank();
    const int64_t t = q.size(2), n_rep = q.size(1) / k.size(1);
    const auto math = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    std::vector<at::Tensor> blocks{at::stack({k, v}).contiguous()};  // [2, B, KV, t, D] per hop
    at::Tensor out, lse;
    for (int s = 0; s < c; ++s) {
      std::vector<comm::WorkPtr> pending;
      if (s + 1 < c) {
        blocks.push_back(at::empty_like(blocks[0]));
        pending.push_back(group->send_async(blocks[s], (r + 1) % c, /*tag=*/45));
        pending.push_back(group->recv_async(blocks[s + 1], (r + c - 1) % c, /*tag=*/45));
      }
      const auto b = block_shape(s, r, c, t);
      const auto& kv = blocks[s];
      auto [o, l] = timed(r, [&] {
        return at::_scaled_dot_product_flash_attention_for_cpu(
            q.narrow(2, b.q0, t - b.q0), repeat_heads(kv[0].narrow(2, 0, b.k_len), n_rep),
            repeat_heads(kv[1].narrow(2, 0, b.k_len), n_rep), 0.0, /*is_causal=*/b.src == r);
      });
      o = o.to(math);
      l = l.to(math).unsqueeze(-1);  // [B, H, rows, 1]
      if (s == 0) {
        out = o, lse = l;
      } else {  // merge the block's rows [q0, t) into the running result
        auto out_rows = out.narrow(2, b.q0, t - b.q0), lse_rows = lse.narrow(2, b.q0, t - b.q0);
        const auto total = at::logaddexp(lse_rows, l);
        const auto merged = at::exp(lse_rows - total) * out_rows + at::exp(l - total) * o;
        out = b.q0 > 0 ? at::cat({out.narrow(2, 0, b.q0), merged}, 2) : merged;
        lse = b.q0 > 0 ? at::cat({lse.narrow(2, 0, b.q0), total}, 2) : total;
      }
      for (auto& w : pending) w->wait();
    }
    out = out.to(q.scalar_type());
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["blocks"] = blocks;  // c of [2, B, KV, t, D]
    ctx->save_for_backward({q, out, lse.squeeze(-1)});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& group = *reinterpret_cast<comm::Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &out = saved[1], &lse = saved[2];
    const auto blocks = ctx->saved_data["blocks"].toTensorVector();
    const auto g = grads[0].contiguous();
    const int c = group.size(), r = group.rank();
    const int64_t t = q.size(2), KV = blocks[0].size(2), n_rep = q.size(1) / KV, B = q.size(0);
    auto dq = at::zeros_like(q);
    // The gradient of block s's K/V on this rank, [2, B, KV, t, D] (zero where no query met a key).
    auto block_grad = [&](int s) {
      const auto b = block_shape(s, r, c, t);
      const auto& kv = blocks[s];
      const auto rows = [&](const at::Tensor& x) { return x.narrow(2, b.q0, t - b.q0); };
      auto [gq, gk, gv] = timed(r, [&] {
        return at::_scaled_dot_product_flash_attention_for_cpu_backward(
            rows(g), rows(q), repeat_heads(kv[0].narrow(2, 0, b.k_len), n_rep),
            repeat_heads(kv[1].narrow(2, 0, b.k_len), n_rep), rows(out), rows(lse).contiguous(), 0.0,
            /*is_causal=*/b.src == r);
      });
      dq.narrow(2, b.q0, t - b.q0).add_(gq);
      auto dkv = at::zeros_like(kv);
      const auto fold = [&](const at::Tensor& x) {  // grouped-query heads back onto their KV head
        return x.reshape({B, KV, n_rep, b.k_len, x.size(3)}).sum(2);
      };
      dkv[0].narrow(2, 0, b.k_len).copy_(fold(gk));
      dkv[1].narrow(2, 0, b.k_len).copy_(fold(gv));
      return dkv;
    };
    at::Tensor carry = block_grad(c - 1);
    for (int s = c - 1; s > 0; --s) {
      // carry: the gradient of the block this rank received at hop s, summed over the ranks it
      // visited after this one; back to the rank it came from, while block s - 1's is computed.
      auto received = at::empty_like(carry);
      auto sent = group.send_async(carry, (r + c - 1) % c, /*tag=*/46);
      auto got = group.recv_async(received, (r + 1) % c, /*tag=*/46);
      auto here = block_grad(s - 1);
      got->wait();
      sent->wait();
      carry = here + received;
    }
    return {dq, carry[0], carry[1], {}};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& group,
                          int64_t window, const at::Tensor& segments, const at::Tensor& all_segments, bool fused) {
  if (fused && window <= 0 && !segments.defined() && q.is_cpu() && group.size() > 1)
    return RingFlash::apply(q, k, v, &group);
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
