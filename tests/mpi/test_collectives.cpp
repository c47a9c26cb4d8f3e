// Communicator semantics on 2 and 4 ranks: every collective, dtype and sub-communicator.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"

using namespace shardlm;

namespace {
comm::CommPtr world() { return comm::mpi_world(); }
}  // namespace

TEST(Collectives, AllReduceSumMaxMinInEveryDtype) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
    auto t = at::arange(6, at::kDouble).add(r).to(dtype);
    w->all_reduce(t, comm::ReduceOp::Sum);
    auto expect = at::arange(6, at::kDouble) * n + n * (n - 1) / 2.0;
    EXPECT_TRUE(at::equal(t.to(at::kDouble), expect)) << dtype;
    auto m = at::full({3}, r + 1.0, at::kDouble).to(dtype);
    w->all_reduce(m, comm::ReduceOp::Max);
    EXPECT_EQ(m[0].item<double>(), n) << dtype;
    w->all_reduce(m.fill_(r + 1.0), comm::ReduceOp::Min);
    EXPECT_EQ(m[2].item<double>(), 1.0) << dtype;
  }
}

TEST(Collectives, ReduceScatterAndAllGather) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  auto in = at::arange(n * 4, at::kFloat) * (r + 1);
  auto out = at::empty({4}, at::kFloat);
  w->reduce_scatter(in, out);
  const double ranks_sum = n * (n + 1) / 2.0;
  EXPECT_TRUE(at::allclose(out, at::arange(r * 4, r * 4 + 4, at::kFloat) * ranks_sum));
  auto gathered = at::empty({n * 4}, at::kFloat);
  w->all_gather(out, gathered);
  EXPECT_TRUE(at::allclose(gathered, at::arange(n * 4, at::kFloat) * ranks_sum));
  auto bad = at::empty({3}, at::kFloat);
  EXPECT_THROW(w->reduce_scatter(in, bad), std::exception);
}

TEST(Collectives, BroadcastSendRecvBarrierAndAsyncOverlap) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  auto t = at::full({5}, static_cast<double>(r), at::kFloat);
  w->broadcast(t, n - 1);
  EXPECT_EQ(t[4].item<float>(), n - 1);
  // A ring: send to the right, receive from the left, both in flight at once.
  auto out = at::full({3}, static_cast<double>(r), at::kFloat), in = at::empty({3}, at::kFloat);
  auto s = w->send_async(out, (r + 1) % n, 5);
  auto q = w->recv_async(in, (r + n - 1) % n, 5);
  q->wait();
  s->wait();
  EXPECT_EQ(in[0].item<float>(), (r + n - 1) % n);
  // Several collectives outstanding together complete correctly in any wait order.
  std::vector<at::Tensor> bufs;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(at::full({1000}, 1.0 + i, at::kFloat));
    works.push_back(w->all_reduce_async(bufs.back()));
  }
  for (int i = 3; i >= 0; --i) works[i]->wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bufs[i][999].item<float>(), (1.0 + i) * n);
  w->barrier();
  EXPECT_GE(w->stats().at("all_reduce").calls, 4);
  EXPECT_GE(w->stats().at("all_reduce").bytes, 4 * 4000);
}

TEST(Collectives, SplitIntoSubCommunicators) {
  auto w = world();
  const int r = w->rank();
  auto half = w->split(r % 2, r, "parity");
  EXPECT_EQ(half->size(), (w->size() + 1 - r % 2) / 2);
  auto t = at::ones({2}, at::kFloat);
  half->all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), half->size());
  auto self = w->split(r, 0, "self");
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
}
