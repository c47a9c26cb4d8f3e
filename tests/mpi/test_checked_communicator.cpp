// debug.check_collectives: the checking communicator passes clean traffic through unchanged (results
// and stats), and a rank that calls another collective, or the same one with another count, or
// receives another message than was sent, fails at once on the ranks involved, naming the rank and
// both calls, with the group still usable afterwards (nothing hangs).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/checked_communicator.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"

using namespace shardlm;

namespace {

comm::CommPtr checked_world() {
  auto w = comm::mpi_world();
  return comm::checked_communicator(w, w->rank());
}

// The message of the Error `call` throws ("" when it does not throw).
template <typename F>
std::string error_of(F call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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
