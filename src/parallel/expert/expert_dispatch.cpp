// See expert_dispatch.h.
#include "parallel/expert/expert_dispatch.h"

#include <ATen/ATen.h>

#include <vector>

#include "parallel/expert/all_to_all_ops.h"
#include "util/error.h"

namespace shardlm::parallel::expert {
namespace {

class ExpertParallelDispatch : public model::ExpertDispatch {
 public:
  ExpertParallelDispatch(comm::CommPtr ep, int64_t experts_per_rank) : ep_(std::move(ep)), local_(experts_per_rank) {}

  at::Tensor experts(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& gate_up,
                     const at::Tensor& down, int64_t layer) override {
    const int n = ep_->size();
    const int64_t El = local_;
    if (static_cast<int64_t>(counts.size()) != El * n || gate_up.size(0) != El || down.size(0) != El)
      fail("layer ", layer, ": expert parallelism over ", n, " ranks keeps ", El, " experts per rank of ", El * n,
           ", but the layer routes over ", counts.size(), " experts and holds ", gate_up.size(0),
           " (internal error: the expert tensors were not split by parallel/expert/expert_parallel.h)");
    // 1. Rows per destination (its experts are consecutive), and per (source, local expert) here.
    std::vector<int64_t> send(n, 0);
    for (int64_t e = 0; e < El * n; ++e) send[static_cast<size_t>(e / El)] += counts[static_cast<size_t>(e)];
    const auto mine = at::tensor(counts, at::kLong);
    auto theirs = at::empty({El * n}, at::kLong);
    const std::vector<int64_t> per_rank(n, El);
    ep_->all_to_all(mine, theirs, per_rank, per_rank);
    const auto* c = theirs.data_ptr<int64_t>();  // c[j * El + e]: rows source j sends for local expert e
    std::vector<int64_t> recv(n, 0), local_counts(El, 0), start(El * n, 0);
    int64_t offset = 0;
    for (int j = 0; j < n; ++j)
      for (int64_t e = 0; e < El; ++e) {
        start[j * El + e] = offset;
        offset += c[j * El + e];
        recv[j] += c[j * El + e];
        local_counts[e] += c[j * El + e];
      }
    // 2. The rows to their experts' ranks.
    const auto arrived = all_to_all(rows, *ep_, send, recv);
    // 3. Expert-major order: expert e's rows from source 0, then source 1, ...
    std::vector<int64_t> perm;
    perm.reserve(static_cast<size_t>(offset));
    for (int64_t e = 0; e < El; ++e)
      for (int j = 0; j < n; ++j)
        for (int64_t r = 0; r < c[j * El + e]; ++r) perm.push_back(start[j * El + e] + r);
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    const auto dev = rows.device();
    const auto sorted = arrived.index_select(0, at::tensor(perm, at::kLong).to(dev));
    const auto y = model::expert_products(sorted, local_counts, gate_up, down);
    // 4. Back to arrival order, and home.
    const auto back = y.index_select(0, at::tensor(inverse, at::kLong).to(dev));
    return all_to_all(back, *ep_, recv, send);
  }

 private:
  comm::CommPtr ep_;
  int64_t local_;
};

}  // namespace

std::shared_ptr<model::ExpertDispatch> make_expert_dispatch(comm::CommPtr ep, int64_t experts_per_rank) {
  return std::make_shared<ExpertParallelDispatch>(std::move(ep), experts_per_rank);
}

}  // namespace shardlm::parallel::expert
