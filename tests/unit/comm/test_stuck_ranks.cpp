// Who a timed-out collective waits for, found through a c10d::Store as the NCCL watchdog does:
// ranks that announce themselves are "stuck in the same wait", the silent ones are missing. The
// watch runs on a clock the test steps (no sleep races the grace period): other ranks announce at
// chosen instants of it. Also pins the timeout message both backends print.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>

#include "comm/stuck_ranks.h"
#include "comm/timeout_report.h"

using namespace shardlm;

namespace {

// A clock that moves only when the watch sleeps; after each sleep, `tick` runs at the new time
// (what the other ranks do meanwhile).
struct SteppedClock {
  double t = 0;
  std::function<void(double)> tick = [](double) {};
  comm::SurveyClock clock() {
    return {[this] { return t; }, [this](double s) {
              t += s;
              tick(t);
            }};
  }
};

// Another rank's announcement: its own watch with no grace (it writes its key and looks once).
void announce(c10d::Store& store, const std::string& prefix, int rank, int size, int64_t seq) {
  SteppedClock other;
  comm::watch_stuck_announcements(store, prefix, rank, size, seq, 0.0, other.clock());
}

}  // namespace

TEST(StuckRanks, SilentRanksAreMissingAndAnnouncedOnesStuck) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int size = 5;
  // Rank 2 times out with rank 0, rank 4 0.3 s into rank 0's 1 s grace, rank 3 only after it (1.2 s);
  // rank 1 never reports.
  announce(*store, "dp/", 2, size, 17);
  SteppedClock c;
  bool four = false, three = false;
  c.tick = [&](double t) {
    if (t >= 0.3 && !four) {
      announce(*store, "dp/", 4, size, 17);
      four = true;
    }
    if (t >= 1.2 && !three) {
      announce(*store, "dp/", 3, size, 17);
      three = true;
    }
  };
  const auto heard = comm::watch_stuck_announcements(*store, "dp/", 0, size, 17, 1.0, c.clock());
  EXPECT_EQ(heard, (std::set<int>{2, 4}));
  EXPECT_TRUE(four);
  EXPECT_FALSE(three) << "the watch went on past its grace";
  EXPECT_GE(c.t, 1.0);
  const auto peers = comm::split_peers(0, size, -1, heard);
  EXPECT_EQ(peers.missing, (std::vector<int>{1, 3}));
  EXPECT_EQ(peers.stuck, (std::vector<int>{2, 4}));
}

TEST(StuckRanks, OtherCommunicatorsAnnouncementsDoNotCount) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  announce(*store, "tp/", 1, 2, 3);  // rank 1 is stuck in another communicator
  SteppedClock c;
  EXPECT_TRUE(comm::watch_stuck_announcements(*store, "dp/", 0, 2, 5, 0.2, c.clock()).empty());
  EXPECT_GE(c.t, 0.2);  // it waited out the grace
}

TEST(StuckRanks, EveryoneHeardEndsTheWaitEarly) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  announce(*store, "w/", 1, 2, 9);
  SteppedClock c;
  EXPECT_EQ(comm::watch_stuck_announcements(*store, "w/", 0, 2, 9, 5.0, c.clock()), (std::set<int>{1}));
  EXPECT_EQ(c.t, 0.0);  // it did not wait at all, let alone the 5 s grace
}

// The threaded survey the NCCL watchdog calls, on the steady clock: everyone already heard, it
// returns what the watch heard (without a grace to wait out, so no timing is asserted).
TEST(StuckRanks, SurveyReturnsWhatItsWatchHeard) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  announce(*store, "s/", 1, 3, 4);
  announce(*store, "s/", 2, 3, 4);
  EXPECT_EQ(comm::survey_stuck_ranks(store, "s/", 0, 3, 4, 5.0), (std::set<int>{1, 2}));
}

TEST(StuckRanks, PointToPointNamesOnlyThePeer) {
  const auto peers = comm::split_peers(1, 4, 3, {0, 2, 3});
  EXPECT_EQ(peers.missing, (std::vector<int>{3}));
  EXPECT_EQ(peers.stuck, (std::vector<int>{0, 2}));
}

TEST(StuckRanks, GraceIsAFifthOfTheTimeoutBetweenOneAndFiveSeconds) {
  EXPECT_EQ(comm::stuck_grace_seconds(2), 1.0);
  EXPECT_EQ(comm::stuck_grace_seconds(10), 2.0);
  EXPECT_EQ(comm::stuck_grace_seconds(300), 5.0);
}

TEST(TimeoutReport, MessageNamesOperationSizeNumberAndRanks) {
  comm::TimeoutReport r;
  r.rank = 1;
  r.comm_name = "dp";
  r.world_ranks = {0, 2, 4, 6};
  r.op = "all_reduce";
  r.detail = comm::operation_detail("all_reduce", at::zeros({1024}, at::kFloat), -1);
  r.waited_s = 4.04;
  r.seq = 12;
  r.peers = {{2}, {0, 3}};
  EXPECT_EQ(comm::timeout_message(r),
            "shardlm: rank 1 of communicator 'dp' (world rank 2): all_reduce of 4 KiB (1024 x Float) timed out after "
            "4.0 s (operation #12). Waiting for rank(s): 2 (world 4). Also stuck in the same wait: rank(s) 0, 3 "
            "(world 6).\n"
            "shardlm: a peer process died, hangs, or runs a different operation; if steps are legitimately this "
            "slow, raise comm.timeout_s. Exiting.\n");
  r.peers = {{}, {}};
  r.world_ranks = {0, 1};
  EXPECT_NE(comm::timeout_message(r).find("Waiting for rank(s): none identified."), std::string::npos);
}

TEST(TimeoutReport, PointToPointDetailNamesThePeer) {
  const auto t = at::zeros({3}, at::kBFloat16);
  EXPECT_EQ(comm::operation_detail("send", t, 2), " of 6 B (3 x BFloat16) to rank 2");
  EXPECT_EQ(comm::operation_detail("recv", t, 0), " of 6 B (3 x BFloat16) from rank 0");
  EXPECT_EQ(comm::operation_detail("broadcast", t, 0), " of 6 B (3 x BFloat16)");
}
