// See all_to_all_ops.h. A torch::autograd::Function whose forward and backward are one all_to_all
// each; the communicator travels to backward as a raw pointer in saved_data (as in
// tensor/tp_ops.cpp), the counts as integer lists.
#include "parallel/expert/all_to_all_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "util/error.h"

namespace shardlm::parallel::expert {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rows of x sent by send_counts, received by recv_counts, into a new tensor.
at::Tensor exchanged(const at::Tensor& x, comm::Communicator& group, const std::vector<int64_t>& send_counts,
                     const std::vector<int64_t>& recv_counts) {
  const auto in = x.contiguous();
  if (in.dim() < 1) fail("expert all_to_all: x must have at least one dimension (rows along dim 0), got a scalar");
  auto sizes = in.sizes().vec();
  sizes[0] = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  auto out = at::empty(sizes, in.options());
  group.all_to_all(in, out, send_counts, recv_counts);
  return out;
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group,
                            std::vector<int64_t> send_counts, std::vector<int64_t> recv_counts) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["send"] = send_counts;
    ctx->saved_data["recv"] = recv_counts;
    return exchanged(x, *group, send_counts, recv_counts);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& group = *reinterpret_cast<comm::Communicator*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    // Transposed: what this rank received from j goes back to j; what it sent j comes back.
    return {exchanged(g[0], group, ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector()),
            {}, {}, {}};
  }
};

}  // namespace

std::vector<int64_t> exchange_counts(comm::Communicator& group, const std::vector<int64_t>& send_counts) {
  const int n = group.size();
  if (static_cast<int>(send_counts.size()) != n)
    fail("expert exchange_counts: ", send_counts.size(), " send counts for a group of ", n,
         " ranks; give one per rank");
  const auto mine = at::tensor(send_counts, at::kLong);
  auto theirs = at::empty({n}, at::kLong);
  const std::vector<int64_t> one(n, 1);
  group.all_to_all(mine, theirs, one, one);
  const auto* p = theirs.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

at::Tensor all_to_all(const at::Tensor& x, comm::Communicator& group, const std::vector<int64_t>& send_counts,
                      const std::vector<int64_t>& recv_counts) {
  return AllToAll::apply(x, &group, send_counts, recv_counts);
}

}  // namespace shardlm::parallel::expert
