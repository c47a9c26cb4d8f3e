// See tp_ops.h. Each op is a torch::autograd::Function whose forward and backward are one
// collective (or none); the communicator travels to backward as a raw pointer in saved_data (it
// outlives the step: ParallelDims owns it).
#include "parallel/tensor/tp_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardlm::parallel::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void remember(AutogradContext* ctx, comm::Communicator& group) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&group));
}
comm::Communicator& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<comm::Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

at::Tensor summed(const at::Tensor& x, comm::Communicator& group) {
  auto out = x.contiguous().clone();
  group.all_reduce(out);
  return out;
}

// Sequence layout <-> the collectives' layout: the ranks' pieces are concatenated along dim 0, so
// the sequence is moved to the front for the exchange ([B, T, ...] <-> [T, B, ...]).
at::Tensor seq_gathered(const at::Tensor& x, comm::Communicator& group) {
  const auto front = x.transpose(0, 1).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] *= group.size();
  auto out = at::empty(sizes, front.options());
  group.all_gather(front, out);
  return out.transpose(0, 1).contiguous();
}
at::Tensor seq_reduce_scattered(const at::Tensor& x, comm::Communicator& group) {
  const auto front = x.transpose(0, 1).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] /= group.size();
  auto out = at::empty(sizes, front.options());
  group.reduce_scatter(front, out);
  return out.transpose(0, 1).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group) {
    remember(ctx, *group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {summed(g[0], group_of(ctx)), {}}; }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, comm::Communicator* group) {
    return summed(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], {}}; }
};

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group) {
    remember(ctx, *group);
    return seq_gathered(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_reduce_scattered(g[0], group_of(ctx)), {}};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group) {
    remember(ctx, *group);
    return seq_reduce_scattered(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_gathered(g[0], group_of(ctx)), {}};
  }
};

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, comm::Communicator& group) { return CopyToRegion::apply(x, &group); }
at::Tensor reduce_from_region(const at::Tensor& x, comm::Communicator& group) {
  return ReduceFromRegion::apply(x, &group);
}
at::Tensor gather_sequence(const at::Tensor& x, comm::Communicator& group) { return GatherSequence::apply(x, &group); }
at::Tensor reduce_scatter_sequence(const at::Tensor& x, comm::Communicator& group) {
  return ReduceScatterSequence::apply(x, &group);
}

at::Tensor all_reduce_max(const at::Tensor& x, comm::Communicator& group) {
  auto out = x.detach().contiguous().clone();
  group.all_reduce(out, comm::ReduceOp::Max);
  return out;
}

}  // namespace shardlm::parallel::tp
