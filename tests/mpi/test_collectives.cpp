// Communicator semantics on 2, 3 and 4 ranks: every collective, dtype and sub-communicator.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "comm/all_to_all.h"
#include "comm/flight_recorder.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"
#include "../support/error_of.h"

using namespace shardlm;

namespace {
using shardlm::test_support::error_of;
comm::CommPtr world() { return comm::mpi_world(); }

// all_to_all test traffic: rows rank i sends rank j, uneven and with zeros ((i + 2j) % 4 gives 0 for
// some pairs at every size from 2 ranks up), and the value of element e of the k-th such row (an
// integer below 256: exact in every dtype tested).
int64_t rows_between(int i, int j) { return (i + 2 * j) % 4; }
double value_of(int i, int j, int64_t k, int64_t e) { return static_cast<double>((37 * i + 11 * j + 5 * k + e) % 251); }

std::vector<int64_t> send_counts_of(int r, int n) {
  std::vector<int64_t> c;
  for (int j = 0; j < n; ++j) c.push_back(rows_between(r, j));
  return c;
}
std::vector<int64_t> recv_counts_of(int r, int n) {
  std::vector<int64_t> c;
  for (int i = 0; i < n; ++i) c.push_back(rows_between(i, r));
  return c;
}
int64_t total(const std::vector<int64_t>& c) { return std::accumulate(c.begin(), c.end(), int64_t{0}); }

// Rank r's input: its rows for rank 0, then rank 1, ...; each row `width` elements.
at::Tensor a2a_input(int r, int n, int64_t width, at::ScalarType dtype) {
  auto t = at::empty({total(send_counts_of(r, n)), width}, at::kDouble);
  int64_t row = 0;
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < rows_between(r, j); ++k, ++row)
      for (int64_t e = 0; e < width; ++e) t[row][e] = value_of(r, j, k, e);
  return t.to(dtype);
}
// What rank r must hold afterwards: the rows every rank i sent it, in rank order.
at::Tensor a2a_expected(int r, int n, int64_t width) {
  auto t = at::empty({total(recv_counts_of(r, n)), width}, at::kDouble);
  int64_t row = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < rows_between(i, r); ++k, ++row)
      for (int64_t e = 0; e < width; ++e) t[row][e] = value_of(i, r, k, e);
  return t;
}

// Forwards only what every communicator must implement: all_to_all is the base class's default,
// built from send_async/recv_async.
class PointToPointOnly : public comm::Communicator {
 public:
  explicit PointToPointOnly(comm::CommPtr inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  comm::WorkPtr all_reduce_async(const at::Tensor& t, comm::ReduceOp op) override { return inner_->all_reduce_async(t, op); }
  comm::WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, comm::ReduceOp op) override {
    return inner_->reduce_scatter_async(in, out, op);
  }
  comm::WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    return inner_->all_gather_async(in, out);
  }
  comm::WorkPtr broadcast_async(const at::Tensor& t, int root) override { return inner_->broadcast_async(t, root); }
  comm::WorkPtr send_async(const at::Tensor& t, int dst, int tag) override { return inner_->send_async(t, dst, tag); }
  comm::WorkPtr recv_async(const at::Tensor& t, int src, int tag) override { return inner_->recv_async(t, src, tag); }
  comm::WorkPtr barrier_async() override { return inner_->barrier_async(); }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return inner_->split(color, key, name);
  }
  const std::map<std::string, comm::OpStats>& stats() const override { return inner_->stats(); }
  void reset_stats() override { inner_->reset_stats(); }

 private:
  comm::CommPtr inner_;
};
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

TEST(Collectives, AllToAllWithUnevenCountsAndZerosInEveryDtype) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  const auto send = send_counts_of(r, n), recv = recv_counts_of(r, n);
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt, at::kByte, at::kChar}) {
    for (int64_t width : {1, 3}) {
      const auto in = a2a_input(r, n, width, dtype);
      auto out = at::full({total(recv), width}, -1.0, at::kDouble).to(dtype);
      w->all_to_all(in, out, send, recv);
      const auto want = a2a_expected(r, n, width);
      // int8 holds values up to 127: compare both through the same conversion.
      EXPECT_TRUE(at::equal(out.to(at::kDouble), want.to(dtype).to(at::kDouble))) << dtype << " width " << width;
      EXPECT_TRUE(at::equal(in, a2a_input(r, n, width, dtype))) << "the input is left as it was";
    }
  }
  // 1-D tensors: a row is one element.
  const auto in1 = a2a_input(r, n, 1, at::kFloat).view({-1});
  auto out1 = at::empty({total(recv)}, at::kFloat);
  w->all_to_all(in1, out1, send, recv);
  EXPECT_TRUE(at::equal(out1.to(at::kDouble), a2a_expected(r, n, 1).view({-1})));
}

TEST(Collectives, AllToAllAsyncInFlightTogetherOnASubCommunicatorWithStats) {
  auto w = world();
  const int r = w->rank();
  // A sub-communicator whose ranks are the world's reversed: counts follow the group's ranks.
  auto rev = w->split(0, w->size() - 1 - r, "reversed");
  const int gr = rev->rank(), n = rev->size();
  ASSERT_EQ(gr, w->size() - 1 - r);
  rev->reset_stats();
  std::vector<at::Tensor> outs;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < 3; ++i) {
    outs.push_back(at::empty({total(recv_counts_of(gr, n)), 4}, at::kFloat));
    works.push_back(rev->all_to_all_async(a2a_input(gr, n, 4, at::kFloat), outs.back(), send_counts_of(gr, n),
                                          recv_counts_of(gr, n)));
  }
  for (int i = 2; i >= 0; --i) works[i]->wait();
  for (const auto& o : outs) EXPECT_TRUE(at::equal(o.to(at::kDouble), a2a_expected(gr, n, 4)));
  // The flight recorder holds each call: this rank's input size, completed.
  const auto entries = comm::flight_recorder().snapshot();
  ASSERT_GE(entries.size(), 3u);
  for (size_t k = entries.size() - 3; k < entries.size(); ++k) {
    EXPECT_EQ(entries[k].op, "all_to_all");
    EXPECT_EQ(entries[k].comm_name, "reversed");
    EXPECT_EQ(entries[k].dtype, "Float");
    EXPECT_EQ(entries[k].numel, total(send_counts_of(gr, n)) * 4);
    EXPECT_EQ(entries[k].state, comm::FlightEntry::State::Completed);
  }
  const auto& st = rev->stats().at("all_to_all");
  EXPECT_EQ(st.calls, 3);
  EXPECT_EQ(st.bytes, 3 * total(send_counts_of(gr, n)) * 4 * 4);  // the input this rank contributed
  EXPECT_GE(st.inflight_seconds, 0.0);
}

TEST(Collectives, AllToAllOfPiecesLargerThanTheSharedMemorySlotsTakesRounds) {
  // Rows of 1000 floats, up to 3 x 350 rows (4.2 MB) between two ranks: many times one rank's
  // 1 MiB shared-memory slot split per destination, so the pieces move over several rounds (with
  // SHARDLM_COMM_SHM=0, through OpenMPI); the last round is partial, and the ranks need different
  // numbers of rounds of their own.
  auto w = world();
  const int r = w->rank(), n = w->size();
  const int64_t width = 1000;
  auto rows = [](int i, int j) { return rows_between(i, j) * 350 + (i == j ? 0 : 1 + j); };
  std::vector<int64_t> send, recv;
  for (int j = 0; j < n; ++j) send.push_back(rows(r, j)), recv.push_back(rows(j, r));
  auto row_values = [&](int i, int j) {  // rank i's rows for rank j: distinct per pair and position
    return at::arange(rows(i, j) * width, at::kLong).remainder(65521).add(1000003LL * (i * n + j)).view({-1, width});
  };
  std::vector<at::Tensor> mine, want;
  for (int j = 0; j < n; ++j) mine.push_back(row_values(r, j)), want.push_back(row_values(j, r));
  const auto in = at::cat(mine).to(at::kFloat), expect = at::cat(want).to(at::kFloat);
  auto out = at::full({total(recv), width}, -1.0f, at::kFloat);
  w->all_to_all(in, out, send, recv);
  EXPECT_TRUE(at::equal(out, expect));
  // And again at once, in flight together with an all_gather started after it.
  auto out2 = at::zeros_like(out);
  auto gathered = at::empty({n}, at::kFloat);
  auto a = w->all_to_all_async(in, out2, send, recv);
  auto g = w->all_gather_async(at::full({1}, float(r), at::kFloat), gathered);
  g->wait();
  a->wait();
  EXPECT_TRUE(at::equal(out2, expect));
  EXPECT_TRUE(at::equal(gathered, at::arange(n, at::kFloat)));
}

TEST(Collectives, AllToAllDefaultFromPointToPointAgreesWithTheBackend) {
  auto w = world();
  const int r = w->rank(), n = w->size();
  PointToPointOnly p2p(w);
  const auto in = a2a_input(r, n, 5, at::kBFloat16);
  auto out = at::empty({total(recv_counts_of(r, n)), 5}, at::kBFloat16);
  p2p.all_to_all(in, out, send_counts_of(r, n), recv_counts_of(r, n));
  EXPECT_TRUE(at::equal(out.to(at::kDouble), a2a_expected(r, n, 5)));
}

TEST(Collectives, AllToAllRefusesBadArgumentsOnEveryRankBeforeCommunicating) {
  // Each call below is wrong the same way on every rank, so every rank refuses it locally and no
  // rank is left waiting in the collective.
  auto w = world();
  const int r = w->rank(), n = w->size();
  const auto send = send_counts_of(r, n), recv = recv_counts_of(r, n);
  const auto in = a2a_input(r, n, 2, at::kFloat);
  auto out = at::empty({total(recv), 2}, at::kFloat);
  auto short_counts = send;
  short_counts.pop_back();
  auto msg = error_of([&] { w->all_to_all(in, out, short_counts, recv); });
  EXPECT_NE(msg.find("all_to_all on communicator 'world': send_counts has " + std::to_string(n - 1) +
                     " entries"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one per rank (" + std::to_string(n) + ")"), std::string::npos) << msg;
  auto more = recv;
  more[0] += 1;
  msg = error_of([&] { w->all_to_all(in, out, send, more); });
  EXPECT_NE(msg.find("recv_counts " + comm::counts_text(more)), std::string::npos) << msg;
  EXPECT_NE(msg.find("but output has " + std::to_string(total(recv)) + " rows"), std::string::npos) << msg;
  auto negative = send;
  negative[0] = -1;
  negative[1] += rows_between(r, 0) + 1;
  msg = error_of([&] { w->all_to_all(in, out, negative, recv); });
  EXPECT_NE(msg.find("send_counts[0] is -1"), std::string::npos) << msg;
  msg = error_of([&] { w->all_to_all(in, at::empty({total(recv), 2}, at::kDouble), send, recv); });
  EXPECT_NE(msg.find("input is Float but output is Double"), std::string::npos) << msg;
  msg = error_of([&] { w->all_to_all(in, at::empty({total(recv), 3}, at::kFloat), send, recv); });
  EXPECT_NE(msg.find("a row (dim 0 slice) of input holds 2 elements, of output 3"), std::string::npos) << msg;
  msg = error_of([&] { w->all_to_all(in.t(), out, send, recv); });
  EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;
  auto both = at::empty({std::max(total(send), total(recv)) * 2}, at::kFloat);
  msg = error_of([&] {
    w->all_to_all(both.narrow(0, 0, total(send)), both.narrow(0, 0, total(recv)), send, recv);
  });
  EXPECT_TRUE(total(send) == 0 || total(recv) == 0 || msg.find("overlap") != std::string::npos) << msg;
  // What a rank sends itself must be what it receives from itself.
  auto self_send = send, self_recv = recv;
  self_send[r] += 1;
  self_recv[r] += 2;
  msg = error_of([&] {
    w->all_to_all(at::zeros({total(self_send)}, at::kFloat), at::zeros({total(self_recv)}, at::kFloat), self_send,
                  self_recv);
  });
  EXPECT_NE(msg.find("rank " + std::to_string(r) + " sends itself " + std::to_string(self_send[r]) + " rows"),
            std::string::npos) << msg;
  w->barrier();  // nobody entered a collective: the group is in step
  w->all_to_all(in, out, send, recv);
  EXPECT_TRUE(at::equal(out.to(at::kDouble), a2a_expected(r, n, 2)));
}

// all_to_all keeps the communicator's deadline. A rank that never arrives would end this whole
// suite (the waiting ranks exit with code 3 and the timeout message), so the scenario only runs
// when tests/integration/test_all_to_all_timeout.py starts this binary for it (with
// SHARDLM_TEST_ALL_TO_ALL_TIMEOUT set) and checks the exit code, the time taken and the message;
// the suites under ctest's mpi_N_ranks skip it.
TEST(CollectiveTimeout, AllToAllWithAMissingRankEndsTheJobNamingIt) {
  const char* timeout = std::getenv("SHARDLM_TEST_ALL_TO_ALL_TIMEOUT");
  if (!timeout) GTEST_SKIP() << "run by tests/integration/test_all_to_all_timeout.py";
  auto w = world();
  const int r = w->rank(), n = w->size();
  auto sub = w->split(0, r, "experts");  // a named group, so the message names it
  sub->set_timeout_seconds(std::atof(timeout));
  auto out = at::empty({total(recv_counts_of(r, n)), 2}, at::kFloat);
  // Once with every rank (this also sets up the group's shared-memory segment, collectively).
  sub->all_to_all(a2a_input(r, n, 2, at::kFloat), out, send_counts_of(r, n), recv_counts_of(r, n));
  if (r == 1) {  // the missing rank: alive, never calls again
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return;
  }
  sub->all_to_all(a2a_input(r, n, 2, at::kFloat), out, send_counts_of(r, n), recv_counts_of(r, n));
  ADD_FAILURE() << "all_to_all returned although rank 1 never called it";
}
