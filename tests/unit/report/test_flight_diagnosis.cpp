// `shardlm diagnose`'s rules (report/flight_diagnosis.h) on hand-made flight records: a desync
// (a skipped call, a different size), a stuck rank, a rank without a record, an unmatched send, rings that dropped different amounts,
// and a clean run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "report/flight_diagnosis.h"

using json = nlohmann::json;
using shardlm::observe::diagnose_flight_records;

namespace {
json entry(const std::string& comm, int comm_rank, std::vector<int> members, long long seq, const std::string& op,
           long long numel, const std::string& state, double t, const std::string& context = "", int peer = -1,
           long long match_seq = -1) {
  return {{"comm", comm},       {"comm_rank", comm_rank}, {"comm_size", static_cast<int>(members.size())},
          {"world_ranks", members}, {"seq", seq},         {"match_seq", match_seq < 0 ? seq : match_seq},
          {"op", op},           {"dtype", "Float"},      {"numel", numel},
          {"peer", peer},       {"context", context},    {"t_start", t},
          {"t_end", state == "completed" ? t + 0.1 : 0.0}, {"state", state}};
}
json dump(int rank, int world, std::vector<json> entries, const std::string& reason = "test") {
  return {{"world_rank", rank}, {"world_size", world}, {"reason", reason}, {"entries", entries}};
}
}  // namespace

TEST(FlightDiagnosis, NamesADesyncWithBothCallSites) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("world", 0, w, 1, "all_reduce", 10, "completed", 1.0, "step 1"),
                  entry("world", 0, w, 2, "all_gather", 64, "started", 2.0, "step 2 / forward micro 0 / layers.1 gather")}),
      dump(1, 2, {entry("world", 1, w, 1, "all_reduce", 10, "completed", 1.0, "step 1"),
                  entry("world", 1, w, 2, "barrier", 0, "started", 2.1, "step 2 / checkpoint")}),
  });
  ASSERT_FALSE(d.findings.empty());
  const auto& f = d.findings.front();
  EXPECT_EQ(f.kind, "desync");
  EXPECT_EQ(f.match_seq, 2);
  EXPECT_NE(f.message.find("rank 0: all_gather of 64 x Float #2"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("layers.1 gather"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("rank 1: barrier"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("checkpoint"), std::string::npos) << f.message;
  EXPECT_NE(d.summary().find("first problem"), std::string::npos);
}

TEST(FlightDiagnosis, SizesMustAgreeToo) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({dump(0, 2, {entry("dp", 0, w, 1, "reduce_scatter", 100, "started", 1.0)}),
                                    dump(1, 2, {entry("dp", 1, w, 1, "reduce_scatter", 96, "started", 1.0)})});
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings[0].kind, "desync");
}

TEST(FlightDiagnosis, ADifferentSizeIsSaidSo) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({dump(0, 2, {entry("dp", 0, w, 1, "reduce_scatter", 100, "completed", 1.0, "rs layers.0")}),
                                    dump(1, 2, {entry("dp", 1, w, 1, "reduce_scatter", 50, "started", 1.0, "rs layers.0")})});
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_NE(d.findings[0].message.find("the same operation with different sizes: 100 elements on rank 0, 50 on rank 1"),
            std::string::npos) << d.findings[0].message;
}

// all_to_all's per-rank counts make its input sizes differ between ranks: not a desync; its dtype
// must still agree.
TEST(FlightDiagnosis, AllToAllSizesDifferByDesign) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({dump(0, 2, {entry("ep", 0, w, 1, "all_to_all", 12, "completed", 1.0)}),
                                    dump(1, 2, {entry("ep", 1, w, 1, "all_to_all", 0, "completed", 1.0)})});
  EXPECT_TRUE(d.findings.empty()) << d.findings[0].message;
  auto other = entry("ep", 1, w, 1, "all_to_all", 12, "started", 1.0);
  other["dtype"] = "BFloat16";
  auto bad = diagnose_flight_records({dump(0, 2, {entry("ep", 0, w, 1, "all_to_all", 12, "started", 1.0)}),
                                      dump(1, 2, {other})});
  ASSERT_EQ(bad.findings.size(), 1u);
  EXPECT_EQ(bad.findings[0].kind, "desync");
  EXPECT_EQ(bad.findings[0].message.find("different sizes"), std::string::npos) << bad.findings[0].message;
}

TEST(FlightDiagnosis, ASkippedCollectiveIsNamedWithTheCallLeftOut) {
  // Rank 1 left out #2 (layers.0's reduce-scatter): its #2 is rank 0's #3.
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("world", 0, w, 1, "all_gather", 8, "completed", 1.0, "gather layers.0"),
                  entry("world", 0, w, 2, "reduce_scatter", 64, "completed", 2.0, "backward micro 0 / reduce-scatter layers.0"),
                  entry("world", 0, w, 3, "reduce_scatter", 96, "failed", 3.0, "backward micro 0 / reduce-scatter embed")},
           "timeout in reduce_scatter #3"),
      dump(1, 2, {entry("world", 1, w, 1, "all_gather", 8, "completed", 1.0, "gather layers.0"),
                  entry("world", 1, w, 2, "reduce_scatter", 96, "started", 2.0, "backward micro 0 / reduce-scatter embed")}),
  });
  ASSERT_FALSE(d.findings.empty());
  const auto& f = d.findings.front();
  EXPECT_EQ(f.kind, "desync");
  EXPECT_EQ(f.match_seq, 2);
  EXPECT_NE(f.message.find("rank 1 skipped a collective: its #2 is what rank 0 called as #3, so the call it left out is "
                           "#2: reduce_scatter of 64 x Float #2 on 'world', completed, during backward micro 0 / "
                           "reduce-scatter layers.0"),
            std::string::npos) << f.message;
}

TEST(FlightDiagnosis, NamesTheAbsentRankAndItsLastOperation) {
  const std::vector<int> w = {0, 1, 2};
  auto d = diagnose_flight_records({
      dump(0, 3, {entry("world", 0, w, 4, "all_reduce", 8, "completed", 1.0), entry("world", 0, w, 5, "all_reduce", 8, "failed", 3.0)},
           "timeout in all_reduce #5"),
      dump(1, 3, {entry("world", 1, w, 4, "all_reduce", 8, "completed", 1.0), entry("world", 1, w, 5, "all_reduce", 8, "started", 3.0)}),
      dump(2, 3, {entry("world", 2, w, 4, "all_reduce", 8, "completed", 1.0, "step 4 / optimizer")}),
  });
  ASSERT_FALSE(d.findings.empty());
  const auto& f = d.findings.front();
  EXPECT_EQ(f.kind, "stuck");
  EXPECT_NE(f.message.find("ranks 0 and 1 started all_reduce"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("rank 2 never did"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("rank 2: its last recorded operation: all_reduce of 8 x Float #4"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("step 4 / optimizer"), std::string::npos) << f.message;
}

TEST(FlightDiagnosis, ARankWithoutARecordIsNamed) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({dump(0, 2, {entry("world", 0, w, 9, "all_reduce", 8, "failed", 1.0)})});
  EXPECT_EQ(d.ranks_without_dump, std::vector<int>{1});
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings[0].kind, "stuck");
  EXPECT_NE(d.findings[0].message.find("rank 1 left no flight record"), std::string::npos) << d.findings[0].message;
  EXPECT_NE(d.summary().find("no record from rank 1"), std::string::npos);
}

TEST(FlightDiagnosis, ASendWithoutItsReceiveIsStuck) {
  // Pipeline: rank 0 sends its 3rd activation to rank 1, which is still in a dp collective.
  const std::vector<int> pp = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("pp", 0, pp, 5, "send", 32, "completed", 1.0, "", 1, 2),
                  entry("pp", 0, pp, 6, "send", 32, "started", 2.0, "forward micro 2", 1, 3)}),
      dump(1, 2, {entry("pp", 1, pp, 5, "recv", 32, "completed", 1.0, "", 0, 2),
                  entry("tp", 0, {1}, 1, "all_reduce", 4, "started", 1.5, "backward micro 1")}),
  });
  ASSERT_FALSE(d.findings.empty());
  bool found = false;
  for (const auto& f : d.findings)
    if (f.kind == "unmatched_send") {
      found = true;
      EXPECT_NE(f.message.find("world rank 1 never posted the matching recv"), std::string::npos) << f.message;
      EXPECT_NE(f.message.find("backward micro 1"), std::string::npos) << f.message;
    }
  EXPECT_TRUE(found) << d.summary();
}

TEST(FlightDiagnosis, RingsThatDroppedDifferentAmountsStillAlign) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("world", 0, w, 3, "all_reduce", 8, "completed", 1.0), entry("world", 0, w, 4, "all_reduce", 8, "completed", 2.0)}),
      dump(1, 2, {entry("world", 1, w, 1, "broadcast", 99, "completed", 0.1), entry("world", 1, w, 2, "broadcast", 99, "completed", 0.2),
                  entry("world", 1, w, 3, "all_reduce", 8, "completed", 1.0), entry("world", 1, w, 4, "all_reduce", 8, "completed", 2.0)}),
  });
  EXPECT_TRUE(d.findings.empty()) << d.summary();
  EXPECT_NE(d.summary().find("no disagreement"), std::string::npos);
}

TEST(FlightDiagnosis, BroadcastRootsCompareAsRanks) {
  // Each rank records the root as its peer, the root itself as -1: the same call.
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({dump(0, 2, {entry("world", 0, w, 1, "broadcast", 8, "completed", 1.0, "", -1)}),
                                    dump(1, 2, {entry("world", 1, w, 1, "broadcast", 8, "completed", 1.0, "", 0)})});
  EXPECT_TRUE(d.findings.empty()) << d.summary();
}

TEST(FlightDiagnosis, ARecordTakenEarlierIsNotAnAbsence) {
  // Records written on request while the job runs: rank 1 wrote at t = 1.5, before rank 0 started #2.
  const std::vector<int> w = {0, 1};
  auto r0 = dump(0, 2, {entry("world", 0, w, 1, "all_reduce", 8, "completed", 1.0), entry("world", 0, w, 2, "all_reduce", 8, "started", 2.0)});
  auto r1 = dump(1, 2, {entry("world", 1, w, 1, "all_reduce", 8, "completed", 1.0)});
  r0["time"] = 2.1;
  r1["time"] = 1.5;
  const auto early = diagnose_flight_records({r0, r1});
  ASSERT_EQ(early.findings.size(), 1u);
  EXPECT_EQ(early.findings[0].kind, "in_progress");  // rank 0 inside #2, nobody named absent
  r1["time"] = 2.5;  // written after rank 0 started #2 without having started it: absent
  auto d = diagnose_flight_records({r0, r1});
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings[0].kind, "stuck");
}

TEST(FlightDiagnosis, ACrashedRankComesFirst) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("world", 0, w, 1, "all_reduce", 8, "completed", 1.0), entry("world", 0, w, 2, "all_reduce", 8, "failed", 2.0)},
           "timeout in all_reduce #2"),
      dump(1, 2, {entry("world", 1, w, 1, "all_reduce", 8, "completed", 1.0, "step 1 / backward micro 0")},
           "fatal signal 11 (Segmentation fault)"),
  });
  ASSERT_EQ(d.findings.size(), 2u);
  EXPECT_EQ(d.findings[0].kind, "crash");
  EXPECT_NE(d.findings[0].message.find("rank 1 ended with fatal signal 11"), std::string::npos) << d.findings[0].message;
  EXPECT_EQ(d.findings[1].kind, "stuck");
}

TEST(FlightDiagnosis, AStoppedRankInsideTheCallIsNamedByTheTimedOutOne) {
  const std::vector<int> w = {0, 1};
  auto d = diagnose_flight_records({
      dump(0, 2, {entry("world", 0, w, 5, "all_reduce", 1, "failed", 1.0)},
           "timeout in all_reduce #5 on communicator 'world'; waiting for world rank(s) 1"),
      dump(1, 2, {entry("world", 1, w, 5, "all_reduce", 1, "started", 1.0)}, "requested (x)"),
  });
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings[0].kind, "in_progress");
  EXPECT_NE(d.findings[0].message.find("rank 0 timed out in it; waiting for world rank(s) 1"), std::string::npos)
      << d.findings[0].message;
}
