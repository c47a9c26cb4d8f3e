// See context_ops.h. The gather reuses sequence parallelism's (tensor/tp_ops.h: all-gather along
// dim 1, backward reduce-scatter), the head exchange expert parallelism's all_to_all of rows
// (expert/all_to_all_ops.h, backward the transposed all_to_all): both are autograd-aware already.
#include "parallel/context/context_ops.h"

#include <ATen/ATen.h>

#include <vector>

#include "parallel/expert/all_to_all_ops.h"
#include "parallel/tensor/tp_ops.h"

namespace shardlm::parallel::context {

at::Tensor gather_chunks(const at::Tensor& kv, comm::Communicator& group) {
  return tp::gather_sequence(kv.transpose(1, 2), group).transpose(1, 2);
}

at::Tensor gathered(const at::Tensor& x, comm::Communicator& group) {
  const auto front = x.t().contiguous();
  auto out = at::empty({front.size(0) * group.size(), front.size(1)}, front.options());
  group.all_gather(front, out);
  return out.t().contiguous();
}

namespace {
// An all_to_all of equal parts: rows = dim 0 split into c equal blocks, block j to rank j.
at::Tensor exchange(const at::Tensor& rows, comm::Communicator& group) {
  const int c = group.size();
  const std::vector<int64_t> counts(static_cast<size_t>(c), rows.size(0) / c);
  return expert::all_to_all(rows, group, counts, counts);
}
}  // namespace

at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& group) {
  const int64_t c = group.size(), B = x.size(0), h = x.size(1), t = x.size(2), D = x.size(3);
  // [h, B, t, D]: rank j's block is heads j h/c ...; received [c (source), h/c, B, t, D].
  const auto got = exchange(x.permute({1, 0, 2, 3}).contiguous().view({h, B * t * D}), group);
  return got.view({c, h / c, B, t, D}).permute({2, 1, 0, 3, 4}).reshape({B, h / c, c * t, D});
}

at::Tensor heads_to_sequence(const at::Tensor& y, comm::Communicator& group) {
  const int64_t c = group.size(), B = y.size(0), h = y.size(1), t = y.size(2) / c, D = y.size(3);
  // [c (destination: whose positions), h, B, t, D]; received [c (source: whose heads), h, B, t, D].
  const auto rows = y.view({B, h, c, t, D}).permute({2, 1, 0, 3, 4}).contiguous().view({c * h, B * t * D});
  return exchange(rows, group).view({c * h, B, t, D}).permute({1, 0, 2, 3});
}

}  // namespace shardlm::parallel::context
