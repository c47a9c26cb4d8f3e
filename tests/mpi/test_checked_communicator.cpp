// debug.check_collectives: the checking communicator passes clean traffic through unchanged (results
// and stats), and a rank that calls another collective, or the same one with another count, or
// receives another message than was sent, fails at once on the ranks involved, naming the rank and
// both calls, with the group still usable afterwards (nothing hangs). all_to_all: ranks whose
// counts do not pair up (rank i's send_counts[j] against rank j's recv_counts[i]), another row size,
// or one rank's invalid arguments stop every rank of the group with the same words.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/checked_communicator.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"
#include "../support/error_of.h"

using namespace shardlm;

namespace {
using shardlm::test_support::error_of;

comm::CommPtr checked_world() {
  auto w = comm::mpi_world();
  return comm::checked_communicator(w, w->rank());
}

}  // namespace

TEST(CheckedCommunicator, CleanTrafficPassesThroughWithTheBackendsStats) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  w->reset_stats();
  auto t = at::full({6}, r + 1.0, at::kFloat);
  w->all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), n * (n + 1) / 2.0f);
  auto gathered = at::empty({n * 2}, at::kDouble);
  w->all_gather_async(at::full({2}, double(r), at::kDouble), gathered)->wait();
  EXPECT_EQ(gathered[2 * n - 1].item<double>(), n - 1);
  auto out = at::empty({3}, at::kFloat);
  w->reduce_scatter(at::ones({3 * n}, at::kFloat), out);
  EXPECT_EQ(out[0].item<float>(), n);
  auto b = at::full({4}, double(r), at::kDouble);
  w->broadcast(b, n - 1);
  EXPECT_EQ(b[3].item<double>(), n - 1);
  // A ring, both directions in flight at once, on a split group (checked too).
  auto sub = w->split(0, r, "ring");
  auto recv = at::empty({5}, at::kLong);
  auto rw = sub->recv_async(recv, (r + n - 1) % n, 3);
  auto sw = sub->send_async(at::full({5}, int64_t(r), at::kLong), (r + 1) % n, 3);
  rw->wait();
  sw->wait();
  EXPECT_EQ(recv[0].item<int64_t>(), (r + n - 1) % n);
  w->barrier();
  // The stats are the backend's for the caller's calls: the signatures are counted apart, 5
  // collectives + split + barrier here, 2 point-to-point signatures on the ring.
  const auto& st = w->stats();
  ASSERT_EQ(st.count("collective_checks"), 1u);
  EXPECT_EQ(st.at("collective_checks").calls, 6);
  EXPECT_EQ(sub->stats().at("collective_checks").calls, 2);
  ASSERT_EQ(st.count("all_gather"), 1u);
  EXPECT_EQ(st.at("all_gather").calls, 1);
  EXPECT_EQ(st.at("all_gather").bytes, 2 * 8);
  EXPECT_EQ(st.at("all_reduce").calls, 1);
  EXPECT_EQ(st.at("all_reduce").bytes, 6 * 4);
  EXPECT_EQ(sub->stats().at("send").calls, 1);
  EXPECT_EQ(sub->stats().at("recv").bytes, 5 * 8);
}

TEST(CheckedCommunicator, AnotherCountIsNamedWithBothCalls) {
  auto w = checked_world();
  const int r = w->rank();
  auto t = at::zeros({r == 1 ? 8 : 4}, at::kFloat);
  const auto msg = error_of([&] { w->all_reduce(t); });
  EXPECT_NE(msg.find("collective mismatch on communicator 'world'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world rank 1 called all_reduce(Float, 8 elements, sum) as its call #0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("called all_reduce(Float, 4 elements, sum) as its call #0"), std::string::npos) << msg;
  w->barrier();  // every rank failed on the same exchange: the group is still in step
}

TEST(CheckedCommunicator, AnotherCollectiveIsNamedWithBothCalls) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  auto t = at::zeros({4}, at::kFloat);
  auto out = at::empty({4 * n}, at::kFloat);
  const auto msg = error_of([&] {
    if (r == n - 1) w->all_gather_async(t, out)->wait();
    else w->all_reduce_async(t, comm::ReduceOp::Max)->wait();
  });
  const std::string last = std::to_string(n - 1);
  EXPECT_NE(msg.find("world rank " + last + " called all_gather(Float, 4 elements -> " + std::to_string(4 * n) +
                     " elements)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("called all_reduce(Float, 4 elements, max)"), std::string::npos) << msg;
  w->barrier();
}

TEST(CheckedCommunicator, AMismatchedReceiveIsNamedWithTheSenderAndItsCall) {
  auto w = checked_world();
  const int r = w->rank();
  std::string msg;
  if (r == 0) w->send(at::ones({4}, at::kFloat), 1, 7);
  if (r == 1) {
    auto buffer = at::zeros({8}, at::kFloat);
    msg = error_of([&] { w->recv(buffer, 0, 7); });
    EXPECT_NE(msg.find("point-to-point mismatch on communicator 'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world rank 1 posted recv(Float, 8 elements, tag 7)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(world rank 0) sent send(Float, 4 elements, tag 7)"), std::string::npos) << msg;
  }
  w->barrier();
}

namespace {
// Rows rank i sends rank j in these tests (zeros included), and rank r's counts from them.
int64_t pair_rows(int i, int j) { return (2 * i + j) % 3; }
std::vector<int64_t> sends_of(int r, int n) {
  std::vector<int64_t> c;
  for (int j = 0; j < n; ++j) c.push_back(pair_rows(r, j));
  return c;
}
std::vector<int64_t> receives_of(int r, int n) {
  std::vector<int64_t> c;
  for (int i = 0; i < n; ++i) c.push_back(pair_rows(i, r));
  return c;
}
int64_t rows(const std::vector<int64_t>& c) {
  int64_t s = 0;
  for (auto v : c) s += v;
  return s;
}
}  // namespace

TEST(CheckedCommunicator, AllToAllWithMatchingCountsPassesThrough) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  w->reset_stats();
  const auto send = sends_of(r, n), recv = receives_of(r, n);
  auto in = at::full({rows(send), 2}, double(r), at::kFloat);
  auto out = at::full({rows(recv), 2}, -1.0, at::kFloat);
  w->all_to_all(in, out, send, recv);
  int64_t row = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < pair_rows(i, r); ++k, ++row) EXPECT_EQ(out[row][1].item<float>(), i);
  const auto& st = w->stats();
  EXPECT_EQ(st.at("all_to_all").calls, 1);
  EXPECT_EQ(st.at("all_to_all").bytes, rows(send) * 2 * 4);
  EXPECT_EQ(st.at("collective_checks").calls, 2);  // the signature, then the counts
  EXPECT_EQ(st.count("all_gather"), 0u);
}

TEST(CheckedCommunicator, AllToAllCountsThatDoNotPairUpAreNamedOnEveryRank) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  auto send = sends_of(r, n);
  const auto recv = receives_of(r, n);
  if (r == 0) send[1] += 2;  // rank 0 sends rank 1 two rows more than rank 1 expects
  const auto msg = error_of([&] {
    w->all_to_all(at::zeros({rows(send)}, at::kFloat), at::zeros({rows(recv)}, at::kFloat), send, recv);
  });
  EXPECT_NE(msg.find("all_to_all count mismatch on communicator 'world' (debug.check_collectives): world rank 0 "
                     "sends " + std::to_string(pair_rows(0, 1) + 2) + " rows to world rank 1, which expects " +
                     std::to_string(pair_rows(0, 1)) + " from it."),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("send_counts[j] must equal rank j's recv_counts[i]"), std::string::npos) << msg;
  w->barrier();
}

TEST(CheckedCommunicator, AllToAllWithAnotherRowSizeIsNamed) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  const auto send = sends_of(r, n), recv = receives_of(r, n);
  const int64_t width = r == 1 ? 3 : 2;
  const auto msg = error_of([&] {
    w->all_to_all(at::zeros({rows(send), width}, at::kFloat), at::zeros({rows(recv), width}, at::kFloat), send, recv);
  });
  EXPECT_NE(msg.find("world rank 1 called all_to_all(Float, rows of 3 elements) as its call #0"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("called all_to_all(Float, rows of 2 elements)"), std::string::npos) << msg;
  w->barrier();
}

TEST(CheckedCommunicator, OneRanksInvalidAllToAllStopsItsPeersToo) {
  auto w = checked_world();
  const int r = w->rank(), n = w->size();
  auto send = sends_of(r, n);
  const auto recv = receives_of(r, n);
  const int last = n - 1;
  if (r == last) send.push_back(0);  // one count too many
  const auto msg = error_of([&] {
    w->all_to_all(at::zeros({rows(send)}, at::kFloat), at::zeros({rows(recv)}, at::kFloat), send, recv);
  });
  if (r == last) {
    EXPECT_NE(msg.find("send_counts has " + std::to_string(n + 1) + " entries"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stopped the other ranks of the group too"), std::string::npos) << msg;
  } else {
    EXPECT_NE(msg.find("world rank(s) " + std::to_string(last) + " called it with invalid arguments"),
              std::string::npos) << msg;
  }
  w->barrier();
}
