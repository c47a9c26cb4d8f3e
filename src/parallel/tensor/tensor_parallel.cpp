// See tensor_parallel.h.
#include "parallel/tensor/tensor_parallel.h"

#include <ATen/ATen.h>

#include <limits>

#include "parallel/tensor/tp_ops.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

// The regions of one tensor-parallel rank (model/parallel_regions.h).
class Regions : public model::ParallelRegions {
 public:
  Regions(comm::CommPtr tp, comm::CommPtr kv_group, bool sp, std::vector<tp::ParamSplit> splits, int64_t vocab_start,
          int64_t vocab_size)
      : tp_(std::move(tp)),
        kv_(std::move(kv_group)),
        sp_(sp),
        splits_(std::move(splits)),
        vocab_start_(vocab_start),
        vocab_size_(vocab_size) {}

  at::Tensor enter(const at::Tensor& x) override {
    return sp_ ? tp::gather_sequence(x, *tp_) : tp::copy_to_region(x, *tp_);
  }
  at::Tensor leave(const at::Tensor& partial) override {
    return sp_ ? tp::reduce_scatter_sequence(partial, *tp_) : tp::reduce_from_region(partial, *tp_);
  }
  at::Tensor weight(size_t param, const at::Tensor& w) override {
    const auto& s = splits_[param];
    if (!s.sum_gradients) return w;
    // Each rank's gradient is partial: norms see only this rank's sequence positions, a replicated
    // KV head only this rank's query heads. Summed over the copies in backward.
    return tp::copy_to_region(w, s.split == tp::Split::KvRows ? *kv_ : *tp_);
  }
  // This rank's vocabulary rows; tokens outside them contribute zeros to the sum leave() takes.
  at::Tensor embed(const at::Tensor& weight, const at::Tensor& ids) override {
    const auto outside = (ids < vocab_start_).logical_or(ids >= vocab_start_ + weight.size(0));
    const auto rows = at::embedding(weight, (ids - vocab_start_).masked_fill(outside, 0));
    return rows.masked_fill(outside.unsqueeze(-1), 0);
  }
  // Megatron's vocab-parallel cross-entropy: log(sum_v exp(z_v - m)) - (z_target - m), with the
  // maximum m, the sum and the target logit each combined over the group. The maximum needs no
  // gradient (the loss does not depend on it); the two sums are g (identity backward), so each
  // rank's logits get softmax - onehot for its own columns.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return token_losses(logits, targets).mean();
  }
  // The same per token, summed over the targets that count (an ignored target's column is
  // outside every rank's vocabulary, so its row only adds log(sum exp), masked here).
  at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& targets) override {
    const auto counts = targets.reshape({-1}).ne(model::kIgnoredTarget);
    return token_losses(logits, targets).masked_fill(counts.logical_not(), 0).sum();
  }
  // Sequence parallelism: each rank routed its own positions (g: all-reduce, identity backward).
  at::Tensor sum_over_sequence(const at::Tensor& partial) override {
    return sp_ ? tp::reduce_from_region(partial, *tp_) : partial;
  }

 private:
  // Cross-entropy of each position, [B*T].
  at::Tensor token_losses(const at::Tensor& logits, const at::Tensor& targets) {
    const int64_t local_vocab = logits.size(-1), real = vocab_size_ - vocab_start_;
    auto z = logits.reshape({-1, local_vocab});
    // Columns of the padding rows (tp_layout.h) are no tokens: -inf, so softmax gives them 0 and
    // their weights no gradient.
    if (real < local_vocab)
      z = z.masked_fill(at::arange(local_vocab, targets.options()).ge(real), -std::numeric_limits<double>::infinity());
    const auto shifted = z - tp::all_reduce_max(std::get<0>(z.detach().max(1, /*keepdim=*/true)), *tp_);
    const auto sum_exp = tp::reduce_from_region(shifted.exp().sum(1), *tp_);
    const auto t = targets.reshape({-1});
    const auto outside = (t < vocab_start_).logical_or(t >= vocab_start_ + local_vocab);
    // The target column of each row, by index_select on the flat view: its backward keeps only the
    // indices (gather's would keep the whole [positions, V/t] tensor for its shape).
    const auto columns = (t - vocab_start_).masked_fill(outside, 0);
    const auto rows = at::arange(t.numel(), t.options());
    const auto picked = shifted.reshape({-1}).index_select(0, rows * local_vocab + columns);
    const auto target_logit = tp::reduce_from_region(picked.masked_fill(outside, 0), *tp_);
    return sum_exp.log() - target_logit;
  }

  comm::CommPtr tp_, kv_;
  bool sp_;
  std::vector<tp::ParamSplit> splits_;
  int64_t vocab_start_, vocab_size_;
};

}  // namespace

TensorParallel::TensorParallel(model::Llama& model, comm::CommPtr tp, bool sequence_parallel)
    : tp_(std::move(tp)), cfg_(model.config()), sequence_parallel_(sequence_parallel) {
  const int t = tp_->size(), r = tp_->rank();
  // Ranks sharing a replicated KV head (t > KV heads); their gradients are summed over this group.
  if (t > cfg_.num_key_value_heads) {
    const int copies = t / static_cast<int>(cfg_.num_key_value_heads);
    kv_group_ = tp_->split(r / copies, r, "tp_kv");
  }
  std::vector<tp::ParamSplit> splits;
  at::NoGradGuard no_grad;
  for (auto& prm : model.parameters()) {
    splits.push_back(tp::param_split(prm.name, cfg_, t, sequence_parallel_));
    norm_weights_.push_back(1.0 / splits.back().replicas);
    prm.tensor = tp::shard(prm.tensor.detach(), prm.name, cfg_, t, r).contiguous().clone().set_requires_grad(true);
  }
  // LoRA: the frozen base takes the same layout (no gradient: no regions' weight() for it).
  if (model.has_lora())
    model.shard_frozen_base([&](const std::string& name, const at::Tensor& full) { return tp::shard(full, name, cfg_, t, r); });
  model.set_regions(std::make_shared<Regions>(tp_, kv_group_, sequence_parallel_, std::move(splits),
                                              r * tp::vocab_rows_per_rank(cfg_, t), cfg_.vocab_size));
}

std::string TensorParallel::describe_prefix() const {
  return "tp=" + std::to_string(size()) + (sequence_parallel_ ? " (sequence parallel)" : "") + " x ";
}

std::vector<std::pair<std::string, comm::CommPtr>> TensorParallel::extra_groups() const {
  if (!kv_group_) return {};
  return {{"comm_tp_kv_", kv_group_}};
}

std::vector<std::pair<std::string, at::Tensor>> TensorParallel::unshard(
    const std::vector<std::pair<std::string, at::Tensor>>& local, const std::vector<char>& only) const {
  // One tensor at a time, and only tensor-parallel rank 0 keeps the joined copy (on the CPU): the
  // whole model never exists on a device, nor on more than one rank per group.
  std::vector<std::pair<std::string, at::Tensor>> out;
  const int t = tp_->size();
  for (size_t i = 0; i < local.size(); ++i) {
    const auto& [name, piece] = local[i];
    if (!only.empty() && !only[i]) {
      out.push_back(local[i]);
      continue;
    }
    const auto flat = piece.contiguous().reshape({-1});
    auto all = at::empty({t * flat.numel()}, flat.options());
    tp_->all_gather(flat, all);
    if (tp_->rank() != 0) {
      out.emplace_back(name, at::Tensor());
      continue;
    }
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < t; ++r) pieces.push_back(all.narrow(0, r * flat.numel(), flat.numel()).view(piece.sizes()));
    out.emplace_back(name, tp::unshard(pieces, name, cfg_).to(at::kCPU).contiguous());
  }
  return out;
}

}  // namespace shardlm::parallel
