// Hostfiles as DeepSpeed and OpenMPI write them, --include/--exclude as DeepSpeed's launcher reads
// them (util/hostfile.h), and the device slots a host's ranks take.
#include <gtest/gtest.h>

#include "util/error.h"
#include "util/hostfile.h"
#include "../../support/error_of.h"

using namespace shardlm;

namespace {
using shardlm::test_support::error_of;
const char* kFile =
    "# DeepSpeed's format\n"
    "worker-0 slots=4\n"
    "worker-1 slots=2 max_slots=4   # OpenMPI's extra key\n"
    "\n"
    "worker-2 slots=2\n";
}  // namespace

TEST(Hostfile, ParsesDeepSpeedAndOpenMpiLines) {
  const auto hosts = util::parse_hostfile(kFile, "hosts");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[1].host, "worker-1");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[1].max_slots, 4);
  EXPECT_EQ(util::total_slots(hosts), 8);
  EXPECT_EQ(util::openmpi_hostfile(hosts), "worker-0 slots=4\nworker-1 slots=2\nworker-2 slots=2\n");
}

TEST(Hostfile, RefusesWhatItCannotRead) {
  EXPECT_NE(error_of([] { util::parse_hostfile("worker-0\n", "h"); }).find("h:1: host worker-0 has no slots=N"), std::string::npos);
  EXPECT_NE(error_of([] { util::parse_hostfile("a slots=2\nb slots=x\n", "h"); }).find("h:2: slots must be a whole number"),
            std::string::npos);
  EXPECT_NE(error_of([] { util::parse_hostfile("a slots=2 gpus=2\n", "h"); }).find("unknown entry 'gpus=2'"), std::string::npos);
  EXPECT_NE(error_of([] { util::parse_hostfile("a slots=2\na slots=1\n", "h"); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([] { util::parse_hostfile("# nothing\n", "h"); }).find("no hosts"), std::string::npos);
}

TEST(Hostfile, IncludeAndExcludeSelectHostsAndSlots) {
  const auto hosts = util::parse_hostfile(kFile, "hosts");
  auto inc = util::select_slots(hosts, "worker-0:1,3@worker-2", "", 0);
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].used, (std::vector<int>{1, 3}));
  EXPECT_EQ(inc[1].host, "worker-2");
  EXPECT_EQ(inc[1].used, (std::vector<int>{0, 1}));
  EXPECT_EQ(util::host_slots_env(inc), "worker-0=1,3;worker-2=0,1");
  auto exc = util::select_slots(hosts, "", "worker-1@worker-0:0", 0);
  ASSERT_EQ(exc.size(), 2u);
  EXPECT_EQ(exc[0].used, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(util::total_slots(exc), 5);
  // --nproc takes the first slots in host order.
  auto first5 = util::select_slots(hosts, "", "", 5);
  EXPECT_EQ(util::openmpi_hostfile(first5), "worker-0 slots=4\nworker-1 slots=1\n");
  EXPECT_NE(error_of([&] { util::select_slots(hosts, "", "", 9); }).find("--nproc 9 but the hostfile has 8 slot(s)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { util::select_slots(hosts, "worker-7", "", 0); }).find("names host 'worker-7'"), std::string::npos);
  EXPECT_NE(error_of([&] { util::select_slots(hosts, "worker-1:2", "", 0); }).find("slot 2 of worker-1, which has slots 0..1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { util::select_slots(hosts, "worker-0", "worker-1", 0); }).find("cannot be combined"),
            std::string::npos);
  EXPECT_NE(error_of([&] { util::select_slots(hosts, "", "worker-0@worker-1@worker-2", 0); }).find("leave no slot"),
            std::string::npos);
}

TEST(Hostfile, RanksOfAHostTakeItsSlots) {
  EXPECT_EQ(util::host_slots("worker-0=1,3;worker-2=0,1", "worker-0"), (std::vector<int>{1, 3}));
  EXPECT_EQ(util::host_slots("worker-0=1,3;worker-2=0,1", "worker-2"), (std::vector<int>{0, 1}));
  EXPECT_TRUE(util::host_slots("worker-0=1,3", "elsewhere").empty());
  EXPECT_NE(error_of([] { util::host_slots("w=1,x", "w"); }).find("slot 'x' of w"), std::string::npos);
}
