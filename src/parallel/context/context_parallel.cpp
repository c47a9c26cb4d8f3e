// See context_parallel.h: the checks, the batch split and the all_gather and all_to_all backends
// (the ring is ring_attention.cpp).
#include "parallel/context/context_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "parallel/context/chunks.h"
#include "parallel/context/context_ops.h"
#include "parallel/context/ring_attention.h"
#include "parallel/tensor/tp_ops.h"
#include "util/error.h"

namespace shardlm::parallel::context {

Mode parse_mode(const std::string& name) {
  if (name == "p2p") return Mode::P2p;
  if (name == "all_gather") return Mode::AllGather;
  if (name == "all_to_all") return Mode::AllToAll;
  fail("parallelism.context_parallel_mode must be \"p2p\", \"all_gather\" or \"all_to_all\", got \"", name, "\"");
}

void check_context_parallel(const model::LlamaConfig& cfg, int c, Mode mode, int64_t seq_len, int tp) {
  if (c <= 1) return;
  if (seq_len % (2 * c) != 0)
    fail("parallelism.context_parallel = ", c, " splits every sequence into 2 x ", c, " = ", 2 * c,
         " chunks, and data.seq_len = ", seq_len, " is not divisible by ", 2 * c,
         "; set data.seq_len to a multiple of ", 2 * c, " or choose another context_parallel");
  const int64_t heads = cfg.num_attention_heads / std::max(1, tp);  // one tensor-parallel rank's
  if (mode == Mode::AllToAll && heads % c != 0)
    fail("parallelism.context_parallel_mode = \"all_to_all\" splits the attention heads over the ", c,
         " context-parallel ranks, and the ", heads, " heads", tp > 1 ? " of one tensor-parallel rank" : " of the model",
         " do not divide by ", c, "; use context_parallel_mode \"p2p\" or \"all_gather\", or a context_parallel that "
         "divides ", heads);
}

data::DataLoader::Batch split_batch(const data::DataLoader::Batch& b, int c, int rank) {
  data::DataLoader::Batch out = b;
  out.inputs = split_sequence(b.inputs, c, rank);
  out.targets = split_sequence(b.targets, c, rank);
  if (b.positions.defined()) {
    out.positions = split_sequence(b.positions, c, rank);
    out.segments = split_sequence(b.segments, c, rank);
  }
  out.world = b.world * c;
  return out;
}

namespace {

class ContextParallelAttention : public model::ContextAttention {
 public:
  ContextParallelAttention(comm::CommPtr cp, Mode mode) : cp_(std::move(cp)), mode_(mode) {}

  at::Tensor positions(int64_t local, const at::Device& device) const override {
    return chunk_positions(local * cp_->size(), cp_->size(), cp_->rank(), device);
  }

  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, model::Attention impl,
                       int64_t window, const at::Tensor& segments) override {
    const int c = cp_->size();
    const int64_t T = q.size(2) * c;
    const auto all_segments = segments.defined() ? gathered(segments, *cp_) : at::Tensor();
    if (mode_ == Mode::P2p)
      return ring_attention(q, k, v, *cp_, window, segments, all_segments, model::attention_is_fused(impl));
    const auto all_pos = gathered_positions(T, c, q.device());
    if (mode_ == Mode::AllGather) {
      // This rank's queries against every rank's keys, in the gathered order (the mask follows them).
      const auto blocked = blocked_between(positions(q.size(2), q.device()), all_pos, window, segments, all_segments);
      return model::masked_attention(q, gather_chunks(k, *cp_), gather_chunks(v, *cp_), impl, blocked);
    }
    // all_to_all: KV heads that c does not divide are repeated to one per query head first.
    const int64_t H = q.size(1), KV = k.size(1);
    const auto widen = [&](const at::Tensor& x) {
      if (KV % c == 0) return x;
      const auto B = x.size(0), t = x.size(2), D = x.size(3);
      return x.unsqueeze(2).expand({B, KV, H / KV, t, D}).reshape({B, H, t, D});
    };
    const auto blocked = blocked_between(all_pos, all_pos, window, all_segments, all_segments);
    const auto out = model::masked_attention(sequence_to_heads(q, *cp_), sequence_to_heads(widen(k), *cp_),
                                             sequence_to_heads(widen(v), *cp_), impl, blocked);
    return heads_to_sequence(out, *cp_);
  }

  int ranks() const override { return cp_->size(); }

  // Forward all-reduce, backward all-reduce (tp_ops' f then g): every rank's loss holds the term.
  at::Tensor sum_over_sequence(const at::Tensor& partial) override {
    return tp::reduce_from_region(tp::copy_to_region(partial, *cp_), *cp_);
  }

  at::Tensor assignments_before(const at::Tensor& counts) override {
    const int c = cp_->size(), r = cp_->rank();
    const int64_t B = counts.size(0), E = counts.size(2);
    auto all = at::empty({c * counts.numel()}, counts.options());
    cp_->all_gather(counts.contiguous().view({-1}), all);
    // [c, B, 2, E] -> [B, 2c, E] in sequence order: rank q's chunks are chunks q and 2c-1-q.
    const auto per_rank = all.view({c, B, 2, E});
    auto row = at::zeros({B, 2 * c, E}, counts.options());
    for (int q = 0; q < c; ++q) {
      row.select(1, q).copy_(per_rank[q].select(1, 0));
      row.select(1, 2 * c - 1 - q).copy_(per_rank[q].select(1, 1));
    }
    const auto flat = row.view({B * 2 * c, E});
    const auto before = (flat.cumsum(0) - flat).view({B, 2 * c, E});
    return at::stack({before.select(1, r), before.select(1, 2 * c - 1 - r)}, 1);
  }

 private:
  comm::CommPtr cp_;
  Mode mode_;
};

}  // namespace

std::shared_ptr<model::ContextAttention> make_context_attention(comm::CommPtr cp, Mode mode) {
  return std::make_shared<ContextParallelAttention>(std::move(cp), mode);
}

}  // namespace shardlm::parallel::context
