// The memory guard's inputs and the out_dir lock, in one process: the per-rank budget divides what
// the host has free, the lock refuses a second holder naming the first and is free once released,
// and the per-rank memory record keeps every rank and the spread.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "observe/rank_memory.h"
#include "util/available_memory.h"
#include "util/error.h"
#include "util/out_dir_lock.h"

using namespace shardlm;

TEST(Guard, HostMemoryBudgetIsSharedByTheRanks) {
  const auto host = host_available_memory();
  ASSERT_GT(host.available, 0);
  EXPECT_FALSE(host.source.empty());
  const auto one = rank_memory_budget("cpu", 1), four = rank_memory_budget("cpu", 4);
  // Both read /proc a moment apart: compare with a margin of what may change meanwhile (1%).
  EXPECT_NEAR(static_cast<double>(four.bytes), one.bytes / 4.0, 0.01 * one.bytes);
  EXPECT_NE(four.why.find("/ 4 ranks on this node"), std::string::npos) << four.why;
  const auto launcher = rank_memory_budget("cpu", 2, int64_t{1} << 40);  // 1 TiB per process: nothing left
  EXPECT_LT(launcher.bytes, 0);
  EXPECT_NE(launcher.why.find("per rank process"), std::string::npos) << launcher.why;
}

TEST(Guard, LocalRanksFromTheLauncher) {
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
  EXPECT_EQ(local_ranks(), 3);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST(Guard, OutDirLockRefusesASecondHolderNamingTheFirst) {
  const auto dir = (std::filesystem::temp_directory_path() / ("shardlm_lock_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  {
    OutDirLock held(dir);
    try {
      OutDirLock second(dir);
      FAIL() << "a second lock on the same out_dir must fail";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("in use by another job (pid " + std::to_string(getpid()) + " on "), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("--out_dir"), std::string::npos) << msg;
    }
    EXPECT_THROW(OutDirLock::check_free(dir), Error);
  }
  EXPECT_NO_THROW(OutDirLock::check_free(dir));  // released with its holder; the .lock file stays
  EXPECT_TRUE(std::filesystem::exists(dir + "/.lock"));
  EXPECT_NO_THROW(OutDirLock again(dir));
  std::filesystem::remove_all(dir);
}

TEST(Guard, RankMemoryRecordsEveryRankAndTheSpread) {
  observe::StepMetrics m;
  observe::record_rank_memory(observe::kPeakRss, {400.0, 600.0, 500.0}, m);
  EXPECT_EQ(m.extra.at("memory_peak_rss.rank1"), 600.0);
  EXPECT_EQ(m.extra.at("memory_peak_rss_max"), 600.0);
  EXPECT_EQ(m.extra.at("memory_peak_rss_min"), 400.0);
  EXPECT_EQ(m.extra.at("memory_peak_rss_mean"), 500.0);
  EXPECT_EQ(m.extra.at("memory_peak_rss_imbalance"), 1.5);
}
