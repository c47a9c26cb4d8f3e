// Who a timed-out collective waits for, found through a c10d::Store as the NCCL watchdog does:
// ranks (threads here) that announce themselves are "stuck in the same wait", the silent ones are
// missing. Also pins the timeout message both backends print.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>

#include "comm/stuck_ranks.h"
#include "comm/timeout_report.h"

using namespace shardlm;

TEST(StuckRanks, SilentRanksAreMissingAndAnnouncedOnesStuck) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int size = 5;
  // Ranks 2 and 4 time out too (rank 4 a little later); ranks 1 and 3 never report.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm::survey_stuck_ranks(store, "dp/", 4, size, 17, 1.0);
  });
  std::thread early([&] { comm::survey_stuck_ranks(store, "dp/", 2, size, 17, 1.0); });
  const auto heard = comm::survey_stuck_ranks(store, "dp/", 0, size, 17, 1.0);
  late.join();
  early.join();
  EXPECT_EQ(heard, (std::set<int>{2, 4}));
  const auto peers = comm::split_peers(0, size, -1, heard);
  EXPECT_EQ(peers.missing, (std::vector<int>{1, 3}));
  EXPECT_EQ(peers.stuck, (std::vector<int>{2, 4}));
}

TEST(StuckRanks, OtherCommunicatorsAnnouncementsDoNotCount) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::survey_stuck_ranks(store, "tp/", 1, 2, 3, 0.0);  // rank 1 is stuck in another communicator
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(comm::survey_stuck_ranks(store, "dp/", 0, 2, 5, 0.2).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));  // it waited out the grace
}

TEST(StuckRanks, EveryoneHeardEndsTheWaitEarly) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  comm::survey_stuck_ranks(store, "w/", 1, 2, 9, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(comm::survey_stuck_ranks(store, "w/", 0, 2, 9, 5.0), (std::set<int>{1}));
  // Before the 5 s grace ran out (the point: it did not wait for it), however loaded the machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(4500));
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
