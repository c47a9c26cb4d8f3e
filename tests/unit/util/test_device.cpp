// Device selection: what a rank computes on, and the clear stop when CUDA is asked for and there is
// no GPU (this test runs on CPU-only CI machines and on GPU machines alike: each branch asserts).
#include <gtest/gtest.h>

#include <cstdlib>

#include "util/device.h"
#include "util/error.h"

using namespace shardlm;

TEST(Device, CpuIsAlwaysAvailableAndHasNoAllocatorCounters) {
  const auto d = select_device("cpu");
  EXPECT_TRUE(d.is_cpu());
  const auto m = device_memory(d);
  EXPECT_EQ(m.allocated + m.reserved + m.peak_allocated + m.peak_reserved, 0);
}

TEST(Device, CudaWithoutAGpuStopsWithTheFixAndWithOneMapsByLocalRank) {
  if (cuda_device_count() == 0) {
    try {
      select_device("cuda");
      FAIL() << "select_device(\"cuda\") must fail without a GPU";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("no CUDA GPU is visible"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--device cpu"), std::string::npos) << msg;
    }
    EXPECT_THROW(require_device("cuda"), Error);
  } else {
    const auto d = select_device("cuda");
    EXPECT_TRUE(d.is_cuda());
    EXPECT_EQ(d.index(), local_rank() % cuda_device_count());
  }
  EXPECT_THROW(select_device("tpu"), Error);
}

TEST(Device, LocalRankComesFromTheLauncher) {
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const std::string keep = saved ? saved : "";
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(local_rank(), 3);
  if (saved) setenv("OMPI_COMM_WORLD_LOCAL_RANK", keep.c_str(), 1);
  else unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}
