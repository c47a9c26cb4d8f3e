// parallel/expert/all_to_all_ops.h on 2, 3 and 4 ranks against a reference built from all_gather:
// every rank gathers every rank's input and upstream weights, replays the whole exchange locally
// (which rows go where) in fp64 with torch's autograd, and compares the distributed forward output
// and the input gradient (backward = the transposed all_to_all) with it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <numeric>

#include "comm/mpi_communicator.h"
#include "parallel/expert/all_to_all_ops.h"

using namespace shardlm;

namespace {

// Rows rank i sends rank j: uneven, zeros included (rank 0 sends itself nothing).
int64_t rows_sent(int i, int j, int /*n*/) { return (3 * i + j) % 4; }

int64_t sum(const std::vector<int64_t>& c) { return std::accumulate(c.begin(), c.end(), int64_t{0}); }

// Every rank's tensor of rank-dependent rows, zero-padded to `max_rows` for all_gather; returns one
// tensor per rank, cut back to its rows.
std::vector<at::Tensor> gathered(comm::Communicator& w, const at::Tensor& mine, const std::vector<int64_t>& rows_of,
                                 int64_t max_rows) {
  const int n = w.size();
  auto padded = at::zeros({max_rows, mine.size(1)}, mine.options());
  padded.narrow(0, 0, mine.size(0)).copy_(mine);
  auto all = at::empty({n * max_rows, mine.size(1)}, mine.options());
  w.all_gather(padded, all);
  std::vector<at::Tensor> out;
  for (int r = 0; r < n; ++r) out.push_back(all.narrow(0, r * max_rows, rows_of[r]).clone());
  return out;
}

}  // namespace

TEST(ExpertAllToAll, ExchangeCountsTransposesTheSendCounts) {
  auto w = comm::mpi_world();
  const int r = w->rank(), n = w->size();
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) send.push_back(rows_sent(r, j, n));
  const auto recv = parallel::expert::exchange_counts(*w, send);
  ASSERT_EQ(static_cast<int>(recv.size()), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(recv[i], rows_sent(i, r, n)) << "from rank " << i;
}

TEST(ExpertAllToAll, ForwardAndBackwardMatchAGatherBasedReference) {
  auto w = comm::mpi_world();
  const int r = w->rank(), n = w->size();
  const int64_t d = 3;
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) send.push_back(rows_sent(r, j, n));
  const auto recv = parallel::expert::exchange_counts(*w, send);

  // This rank's input (fp64, distinct per rank) and the weight its output is multiplied by, so the
  // output's gradient differs row by row and rank by rank.
  at::manual_seed(1234 + r);
  const auto x0 = at::randn({sum(send), d}, at::kDouble);
  const auto weight = at::randn({sum(recv), d}, at::kDouble);
  auto x = x0.clone().requires_grad_(true);
  auto y = parallel::expert::all_to_all(x, *w, send, recv);
  ASSERT_EQ(y.size(0), sum(recv));
  (y * weight).sum().backward();

  // Reference: everybody's x and weight, the exchange replayed locally as slicing + concatenation.
  std::vector<int64_t> send_rows(n), recv_rows(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) send_rows[i] += rows_sent(i, j, n), recv_rows[j] += rows_sent(i, j, n);
  }
  const int64_t max_rows = std::max(*std::max_element(send_rows.begin(), send_rows.end()),
                                    *std::max_element(recv_rows.begin(), recv_rows.end()));
  auto xs = gathered(*w, x0, send_rows, max_rows);
  const auto ws = gathered(*w, weight, recv_rows, max_rows);
  for (auto& t : xs) t.requires_grad_(true);
  at::Tensor loss = at::zeros({}, at::kDouble);
  at::Tensor y_mine;
  for (int j = 0; j < n; ++j) {  // rank j's output: rank 0's rows for j, then rank 1's, ...
    std::vector<at::Tensor> pieces;
    for (int i = 0; i < n; ++i) {
      int64_t start = 0;
      for (int k = 0; k < j; ++k) start += rows_sent(i, k, n);
      pieces.push_back(xs[i].narrow(0, start, rows_sent(i, j, n)));
    }
    const auto yj = at::cat(pieces, 0);
    if (j == r) y_mine = yj.detach();
    loss = loss + (yj * ws[j]).sum();
  }
  const auto grads = torch::autograd::grad({loss}, {xs[r]});
  EXPECT_TRUE(at::equal(y.detach(), y_mine)) << "forward";
  EXPECT_TRUE(at::allclose(x.grad(), grads[0], 0, 1e-12)) << "backward: x.grad\n" << x.grad() << "\nreference\n"
                                                          << grads[0];
  EXPECT_TRUE(at::equal(x.detach(), x0)) << "the input is left as it was";
}

TEST(ExpertAllToAll, RoundTripIsTheIdentityInBf16) {
  // Dispatch then combine (counts transposed) brings every row home; its gradient is the identity too.
  auto w = comm::mpi_world();
  const int r = w->rank(), n = w->size();
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) send.push_back(rows_sent(r, j, n) + 1);
  const auto recv = parallel::expert::exchange_counts(*w, send);
  at::manual_seed(99 + r);
  auto x = at::randn({sum(send), 2, 4}, at::kFloat).to(at::kBFloat16).requires_grad_(true);
  const auto there = parallel::expert::all_to_all(x, *w, send, recv);
  const auto back = parallel::expert::all_to_all(there * 2, *w, recv, send);
  EXPECT_TRUE(at::equal(back.detach(), x.detach() * 2));
  back.sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::full_like(x, 2)));
}
