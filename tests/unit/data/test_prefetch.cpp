// BatchPrefetcher (data/loader/prefetch.h): whatever the depth and the order of requests (in order, after an
// evaluation's jump back, a resume's jump forward), every batch equals the loader's own, and an error
// assembling a batch reaches the caller that asks for it.
#include <gtest/gtest.h>

#include <numeric>

#include "data/loader/prefetch.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {

void expect_same(const DataLoader::Batch& a, const DataLoader::Batch& b, int64_t m) {
  EXPECT_TRUE(at::equal(a.inputs, b.inputs)) << "micro-step " << m;
  EXPECT_TRUE(at::equal(a.targets, b.targets)) << "micro-step " << m;
  EXPECT_EQ(a.counted_all_ranks, b.counted_all_ranks);
}

}  // namespace

TEST(BatchPrefetcher, EveryRequestOrderGivesTheLoadersBatches) {
  const auto tokens = iota_tokens(5000);
  const std::vector<int64_t> requests = {0, 1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 7, 8, 100, 101, 3, 250, 251, 252, 9};
  for (const bool shuffle : {false, true}) {
    const DataLoader reference(tokens, 2, 8, 1, 2, DataLoader::Order{shuffle, 5});
    for (const int depth : {0, 1, 2, 5}) {
      BatchPrefetcher prefetcher(std::make_unique<DataLoader>(tokens, 2, 8, 1, 2, DataLoader::Order{shuffle, 5}), depth,
                                 c10::Device(c10::kCPU));
      EXPECT_EQ(prefetcher.depth(), depth);
      for (const int64_t m : requests) expect_same(prefetcher.batch(m), reference.batch(m), m);
    }
  }
}

TEST(BatchPrefetcher, AnErrorReachesTheCallerOfThatBatch) {
  BatchPrefetcher prefetcher(std::make_unique<DataLoader>(iota_tokens(100), 2, 4, 0, 1), 3, c10::Device(c10::kCPU));
  EXPECT_NO_THROW(prefetcher.batch(0));
  EXPECT_TRUE(Contains(error_message([&] { prefetcher.batch(-1); }), "negative"));
  EXPECT_NO_THROW(prefetcher.batch(1));  // and it goes on
}
