// debug.check_collectives on all_to_all without MPI: ranks are threads of this process over an
// in-memory all_gather, each wrapped by checked_communicator(). Up to 6 ranks, more than the MPI
// suites start: every rank fails with the same message naming the pairs whose counts do not pair up
// (the first four, then how many more), a rank with invalid arguments stops the others, and a clean
// call reaches the wrapped communicator with the caller's counts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/checked_communicator.h"
#include "util/error.h"

using namespace shardlm;

namespace {

class Done : public comm::Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// What the threads share: a reusable barrier and one slot per rank.
struct World {
  explicit World(int n) : n(n), slots(n) {}
  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<at::Tensor> slots;
  std::vector<std::vector<int64_t>> a2a_sends;  // what reached the wrapped all_to_all, per rank
};

// One rank: all_gather through the shared slots; all_to_all records its counts; nothing else is used.
class ThreadRank : public comm::Communicator {
 public:
  ThreadRank(World* w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->n; }
  const std::string& name() const override { return name_; }
  comm::WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    w_->slots[rank_] = in.clone();
    w_->barrier();
    for (int r = 0; r < w_->n; ++r) out.narrow(0, r * in.numel(), in.numel()).copy_(w_->slots[r]);
    w_->barrier();  // nobody overwrites a slot before everyone copied it
    return std::make_shared<Done>();
  }
  comm::WorkPtr all_to_all_async(const at::Tensor&, const at::Tensor&, const std::vector<int64_t>& send,
                                 const std::vector<int64_t>&) override {
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->a2a_sends[rank_] = send;
    return std::make_shared<Done>();
  }
  comm::WorkPtr all_reduce_async(const at::Tensor&, comm::ReduceOp) override { return unused(); }
  comm::WorkPtr reduce_scatter_async(const at::Tensor&, const at::Tensor&, comm::ReduceOp) override { return unused(); }
  comm::WorkPtr broadcast_async(const at::Tensor&, int) override { return unused(); }
  comm::WorkPtr send_async(const at::Tensor&, int, int) override { return unused(); }
  comm::WorkPtr recv_async(const at::Tensor&, int, int) override { return unused(); }
  comm::WorkPtr barrier_async() override { return unused(); }
  std::shared_ptr<Communicator> split(int, int, const std::string&) override { unused(); }

 private:
  [[noreturn]] comm::WorkPtr unused() { fail("ThreadRank: not used by these tests"); }
  World* w_;
  int rank_;
  std::string name_ = "ep";
};

// Runs body(rank, checked communicator) on n threads; returns each rank's error message ("" if none).
std::vector<std::string> on_ranks(int n, World* world,
                                  const std::function<void(int, comm::Communicator&)>& body) {
  std::vector<std::string> errors(n);
  world->a2a_sends.assign(n, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto checked = comm::checked_communicator(std::make_shared<ThreadRank>(world, r), 10 + r);
      try {
        body(r, *checked);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

int64_t rows(int i, int j) { return (i * 3 + j) % 4; }
std::vector<int64_t> sends(int r, int n) {
  std::vector<int64_t> c;
  for (int j = 0; j < n; ++j) c.push_back(rows(r, j));
  return c;
}
std::vector<int64_t> receives(int r, int n) {
  std::vector<int64_t> c;
  for (int i = 0; i < n; ++i) c.push_back(rows(i, r));
  return c;
}
int64_t sum(const std::vector<int64_t>& c) { return std::accumulate(c.begin(), c.end(), int64_t{0}); }

void call(comm::Communicator& c, const std::vector<int64_t>& s, const std::vector<int64_t>& r) {
  c.all_to_all(at::zeros({sum(s), 2}), at::zeros({sum(r), 2}), s, r);
}

}  // namespace

TEST(CheckedAllToAll, MatchingCountsReachTheWrappedCommunicator) {
  const int n = 5;
  World world(n);
  const auto errors = on_ranks(n, &world, [&](int r, comm::Communicator& c) { call(c, sends(r, n), receives(r, n)); });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(world.a2a_sends[r], sends(r, n)) << "rank " << r;
  }
}

TEST(CheckedAllToAll, EveryRankNamesThePairsThatDisagree) {
  const int n = 6;
  World world(n);
  // Every rank but the last sends one more row to its right neighbour than that one expects: five
  // pairs disagree; the message names four and counts the fifth.
  const auto errors = on_ranks(n, &world, [&](int r, comm::Communicator& c) {
    auto s = sends(r, n);
    if (r < n - 1) s[r + 1] += 1;
    call(c, s, receives(r, n));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], errors[0]) << "rank " << r << " must fail with the same words";
    EXPECT_NE(errors[r].find("all_to_all count mismatch on communicator 'ep' (debug.check_collectives): world rank 10 "
                             "sends " + std::to_string(rows(0, 1) + 1) + " rows to world rank 11, which expects " +
                             std::to_string(rows(0, 1)) + " from it"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("; and 1 more pair(s)."), std::string::npos) << errors[r];
    EXPECT_TRUE(world.a2a_sends[r].empty()) << "nothing reached the backend";
  }
}

TEST(CheckedAllToAll, ARankWithInvalidArgumentsStopsTheOthers) {
  const int n = 3;
  World world(n);
  const auto errors = on_ranks(n, &world, [&](int r, comm::Communicator& c) {
    if (r == 2) c.all_to_all(at::zeros({sum(sends(r, n)) + 1, 2}), at::zeros({sum(receives(r, n)), 2}), sends(r, n),
                             receives(r, n));  // one row more than its counts send
    else call(c, sends(r, n), receives(r, n));
  });
  EXPECT_NE(errors[2].find("send_counts ["), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("but input has " + std::to_string(sum(sends(2, n)) + 1) + " rows"), std::string::npos)
      << errors[2];
  EXPECT_NE(errors[2].find("stopped the other ranks of the group too"), std::string::npos) << errors[2];
  for (int r : {0, 1})
    EXPECT_NE(errors[r].find("world rank(s) 12 called it with invalid arguments"), std::string::npos) << errors[r];
}
