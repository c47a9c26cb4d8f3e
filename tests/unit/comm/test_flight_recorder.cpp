// The flight recorder's ring buffer, numbering and dumps (comm/flight_recorder.h), without MPI: a
// channel stands for a communicator, entries are recorded as a backend records them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/flight_recorder.h"
#include "comm/flight_signal_dump.h"

using namespace shardlm;

namespace {
std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardlm_fr_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}
comm::FlightChannel channel(const std::string& name, int rank, int size, std::vector<int> world_ranks) {
  comm::FlightChannel c;
  c.comm_name = name, c.rank = rank, c.size = size, c.world_ranks = std::move(world_ranks);
  return c;
}
nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j;
  in >> j;
  return j;
}
}  // namespace

TEST(FlightRecorder, KeepsTheLastEntriesNumberedPerCommunicatorAndPeer) {
  auto& fr = comm::flight_recorder();
  fr.configure(4, "", 0, 2);
  comm::FlightChannel dp = channel("dp", 0, 2, {0, 1});
  comm::FlightChannel pp = channel("pp", 1, 2, {0, 1});
  const auto t = at::zeros({8}, at::kFloat);
  int64_t h1;
  {
    comm::FlightContext step("step 3");
    comm::FlightContext unit("layers.0 gather");
    h1 = fr.begin(dp, 1, "all_gather", &t, -1);
  }
  fr.complete(h1);
  fr.begin(pp, 1, "send", &t, 0);
  fr.begin(pp, 2, "send", &t, 0);
  fr.begin(pp, 3, "recv", &t, 0);
  const int64_t h5 = fr.begin(dp, 2, "reduce_scatter", &t, -1);
  fr.fail(h5);
  fr.complete(h1);  // overwritten by now: ignored
  const auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 4u);  // the first of five fell out of the ring
  EXPECT_EQ(entries[0].op, "send");
  EXPECT_EQ(entries[0].match_seq, 1);
  EXPECT_EQ(entries[1].match_seq, 2);  // second send to peer 0
  EXPECT_EQ(entries[2].op, "recv");
  EXPECT_EQ(entries[2].match_seq, 1);  // first receive from peer 0
  EXPECT_EQ(entries[3].match_seq, 2);  // dp's second collective
  EXPECT_EQ(entries[3].state, comm::FlightEntry::State::Failed);
  EXPECT_EQ(entries[3].dtype, "Float");
  EXPECT_EQ(entries[3].numel, 8);
  EXPECT_EQ(entries[0].state, comm::FlightEntry::State::Started);
  EXPECT_EQ(fr.recorded(), 5);
  EXPECT_FALSE(fr.dump("no directory"));  // configured without one: nothing written
}

TEST(FlightRecorder, ContextScopesNest) {
  EXPECT_EQ(comm::FlightContext::current(), "");
  comm::FlightContext a("backward micro 1");
  {
    comm::FlightContext b("layers.3");
    EXPECT_EQ(comm::FlightContext::current(), "backward micro 1 / layers.3");
  }
  EXPECT_EQ(comm::FlightContext::current(), "backward micro 1");
}

TEST(FlightRecorder, DumpsAtomicallyAndOnRequest) {
  const auto dir = fresh_dir("dump");
  auto& fr = comm::flight_recorder();
  fr.configure(16, dir, 3, 4);
  EXPECT_FALSE(std::filesystem::exists(dir));  // nothing is created before there is something to write
  comm::FlightChannel world = channel("world", 3, 4, {0, 1, 2, 3});
  const auto t = at::zeros({2}, at::kDouble);
  fr.complete(fr.begin(world, 7, "all_reduce", &t, -1));
  ASSERT_TRUE(fr.dump("test"));
  auto j = read_json(dir + "/rank3.json");
  EXPECT_EQ(j["reason"], "test");
  EXPECT_EQ(j["world_rank"], 3);
  EXPECT_EQ(j["world_size"], 4);
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["op"], "all_reduce");
  EXPECT_EQ(j["entries"][0]["seq"], 7);
  EXPECT_EQ(j["entries"][0]["state"], "completed");
  EXPECT_EQ(j["entries"][0]["world_ranks"], nlohmann::json({0, 1, 2, 3}));
  for (const auto& f : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
  // Somebody else's request (a timed-out peer, a user's touch) makes the watcher dump within ~100 ms.
  std::ofstream(dir + "/dump_request") << "x";
  std::string reason;
  for (int i = 0; i < 50 && reason.rfind("requested", 0) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    reason = read_json(dir + "/rank3.json")["reason"];
  }
  EXPECT_EQ(reason.rfind("requested", 0), 0u) << reason;
  // A request of its own is left to the others: the dump with the telling reason stays.
  ASSERT_TRUE(fr.dump("timeout in all_reduce #7"));
  fr.request_dumps();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(read_json(dir + "/rank3.json")["reason"], "timeout in all_reduce #7");
  // A later run in the same directory keeps the earlier record aside.
  fr.configure(16, dir, 3, 4);
  EXPECT_TRUE(std::filesystem::exists(dir + "/rank3.previous.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank3.json"));
  fr.configure(comm::kFlightRecorderEntries, "", 0, 1);
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, OffRecordsNothingLabelsNothingAndWritesNothing) {
  const auto dir = fresh_dir("off");
  auto& fr = comm::flight_recorder();
  fr.configure(0, dir, 0, 2);  // flight_recorder.enabled false
  EXPECT_FALSE(fr.enabled());
  comm::FlightChannel world = channel("world", 0, 2, {0, 1});
  const auto t = at::zeros({4}, at::kFloat);
  bool built = false;
  {
    comm::FlightContext a("train");
    comm::FlightContext b([&] {
      built = true;
      return std::string("reduce-scatter layers.0");
    });
    EXPECT_EQ(comm::FlightContext::current(), "");  // no phase kept
    const int64_t h = fr.begin(world, 1, "all_reduce", &t, -1);
    EXPECT_EQ(h, -1);
    fr.complete(h);
    fr.fail(h);
  }
  EXPECT_FALSE(built);  // the label was never even built
  EXPECT_EQ(fr.recorded(), 0);
  EXPECT_TRUE(fr.snapshot().empty());
  EXPECT_FALSE(fr.dump("test"));
  EXPECT_FALSE(fr.dump_from_signal("fatal signal 11 (Segmentation fault)"));
  fr.request_dumps();
  EXPECT_FALSE(std::filesystem::exists(dir));  // no file, no folder
  EXPECT_EQ(world.collectives, 0);
  fr.configure(comm::kFlightRecorderEntries, "", 0, 1);
  EXPECT_TRUE(fr.enabled());
  {
    comm::FlightContext a([] { return std::string("on again"); });
    EXPECT_EQ(comm::FlightContext::current(), "on again");
  }
}

// The fatal-signal writer formats by hand: its file must be the JSON to_json() gives, entry by entry,
// whatever the names hold (quotes, backslashes, control characters, UTF-8), after the ring wrapped.
TEST(FlightRecorder, SignalDumpIsTheSameRecordAsTheNormalDump) {
  const auto dir = fresh_dir("signal_format");
  std::filesystem::create_directories(dir);  // the run directory; the recorder's folder is inside it
  const auto records = dir + "/flight_recorder";
  auto& fr = comm::flight_recorder();
  fr.configure(5, records, 1, 3);
  comm::FlightChannel odd = channel("pp \"0\\1\"\tü", 1, 3, {2, 0, 1});
  comm::FlightChannel world = channel("world", 1, 3, {0, 1, 2});
  const auto f = at::zeros({3}, at::kFloat);
  const auto b = at::zeros({7}, at::kBFloat16);
  {
    comm::FlightContext step("train");
    for (int i = 0; i < 4; ++i) fr.complete(fr.begin(world, i + 1, "all_reduce", &f, -1));
    comm::FlightContext label([] { return std::string("gather \"layers.0\" \\ ünit\n"); });
    fr.begin(odd, 1, "send", &b, 2);
    fr.fail(fr.begin(odd, 2, "recv", &b, 0));
    fr.begin(world, 5, "barrier", nullptr, -1);
  }
  ASSERT_TRUE(fr.dump_from_signal("fatal signal 6 (Aborted)"));
  const auto got = read_json(records + "/rank1.json");
  const auto want = fr.to_json("fatal signal 6 (Aborted)");
  for (const char* k : {"format", "world_rank", "world_size", "reason", "capacity", "recorded"}) EXPECT_EQ(got[k], want[k]) << k;
  EXPECT_EQ(got["recorded"], 7);
  EXPECT_EQ(got["skipped"], 0);
  EXPECT_EQ(got["pid"], static_cast<int64_t>(getpid()));
  ASSERT_EQ(got["entries"].size(), 5u);  // the last five of seven
  ASSERT_EQ(want["entries"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const auto& g = got["entries"][i];
    const auto& w = want["entries"][i];
    for (const char* k : {"comm", "comm_rank", "comm_size", "world_ranks", "seq", "match_seq", "op", "dtype", "numel",
                          "peer", "context", "state"})
      EXPECT_EQ(g[k], w[k]) << "entry " << i << " " << k;
    EXPECT_NEAR(g["t_start"].get<double>(), w["t_start"].get<double>(), 1e-6) << i;
    EXPECT_NEAR(g["t_end"].get<double>(), w["t_end"].get<double>(), 1e-6) << i;
  }
  EXPECT_EQ(got["entries"][2]["comm"], "pp \"0\\1\"\tü");
  EXPECT_EQ(got["entries"][2]["context"], "train / gather \"layers.0\" \\ ünit\n");
  EXPECT_EQ(got["entries"][3]["state"], "failed");
  EXPECT_EQ(got["entries"][4]["dtype"], "");
  for (const auto& e : std::filesystem::directory_iterator(records))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // Without the run directory nothing is created (as dump()).
  fr.configure(5, dir + "/gone/flight_recorder", 1, 3);
  fr.complete(fr.begin(world, 1, "all_reduce", &f, -1));
  EXPECT_FALSE(fr.dump_from_signal("fatal signal 11 (Segmentation fault)"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/gone"));
  fr.configure(comm::kFlightRecorderEntries, "", 0, 1);
  std::filesystem::remove_all(dir);
}

// A phase too long for its slot is cut, at a character boundary (the record stays valid UTF-8).
TEST(FlightRecorder, LongPhaseIsCutAtACharacterBoundary) {
  auto& fr = comm::flight_recorder();
  fr.configure(4, "", 0, 1);
  comm::FlightChannel world = channel("world", 0, 1, {0});
  std::string label;
  while (label.size() < 2 * comm::FlightSlot::kContextChars) label += "é";  // 2 bytes each
  for (const std::string prefix : {"", "x"}) {  // the cut falls after a whole character, then inside one
    comm::FlightContext a(prefix + label);
    fr.begin(world, 1, "barrier", nullptr, -1);
    const std::string kept = fr.snapshot().back().context;
    EXPECT_LT(kept.size(), comm::FlightSlot::kContextChars);
    EXPECT_GE(kept.size() + 2, comm::FlightSlot::kContextChars - 1);
    EXPECT_EQ((kept.size() - prefix.size()) % 2, 0u) << kept.size();
    EXPECT_EQ(kept, (prefix + label).substr(0, kept.size()));
    EXPECT_NO_THROW(nlohmann::json::parse(nlohmann::json(kept).dump()));
  }
  fr.configure(comm::kFlightRecorderEntries, "", 0, 1);
}

TEST(FlightRecorder, FatalReasonNamesTheSignalAsStrsignalDoes) {
  char buf[96];
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    comm::flight_signal::fatal_reason(sig, buf, sizeof buf);
    EXPECT_EQ(std::string(buf), "fatal signal " + std::to_string(sig) + " (" + strsignal(sig) + ")");
  }
  comm::flight_signal::fatal_reason(SIGSEGV, buf, 8);
  EXPECT_EQ(std::string(buf), "fatal s");
}
