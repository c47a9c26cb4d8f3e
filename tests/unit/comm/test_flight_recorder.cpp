// The flight recorder's ring buffer, numbering and dumps (comm/flight_recorder.h), without MPI: a
// channel stands for a communicator, entries are recorded as a backend records them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/flight_recorder.h"

using namespace shardlm;

namespace {
std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardlm_fr_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
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
  comm::FlightChannel dp{"dp", 0, 2, {0, 1}};
  comm::FlightChannel pp{"pp", 1, 2, {0, 1}};
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
  comm::FlightChannel world{"world", 3, 4, {0, 1, 2, 3}};
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
