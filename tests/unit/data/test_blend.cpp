// Blended datasets (data/loader/blend.h, data.blend): the order is Megatron-Core's build_blending_indices
// sample for sample, at any access pattern of the snapshot cursor; a blended loader reads whole rows
// of the dataset the order names, world-independently, and with data.shuffle every row of a
// dataset once per pass of that dataset.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "data/loader/blend.h"
#include "data/loader/data_loader.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {

// Megatron-Core's helpers.cpp build_blending_indices, transcribed as its arrays (the reference).
void megatron_blending_indices(const std::vector<double>& raw_weights, int64_t size, std::vector<int>* dataset_index,
                               std::vector<int64_t>* dataset_sample_index) {
  const double sum = std::accumulate(raw_weights.begin(), raw_weights.end(), 0.0);
  std::vector<double> weights;
  for (double w : raw_weights) weights.push_back(w / sum);
  std::vector<int64_t> current(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int64_t best = 0;
    double max_error = weights[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * x - static_cast<double>(current[d]);
      if (error > max_error) max_error = error, best = static_cast<int64_t>(d);
    }
    dataset_index->push_back(static_cast<int>(best));
    dataset_sample_index->push_back(current[static_cast<size_t>(best)]);
    ++current[static_cast<size_t>(best)];
  }
}

}  // namespace

TEST(BlendedOrder, EqualsMegatronsIndicesAtAnyAccessOrder) {
  for (const std::vector<double>& w : {std::vector<double>{0.7, 0.3}, {3, 2, 5}, {1, 1}, {0.01, 0.5, 2, 0.2}}) {
    const int64_t n = 3 * BlendedOrder::kSnapshotEvery + 77;
    std::vector<int> d;
    std::vector<int64_t> j;
    megatron_blending_indices(w, n, &d, &j);
    BlendedOrder order(w);
    for (int64_t g = 0; g < n; ++g) {  // in order
      const auto p = order.at(g);
      ASSERT_EQ(p.dataset, d[static_cast<size_t>(g)]) << "g=" << g;
      ASSERT_EQ(p.index, j[static_cast<size_t>(g)]) << "g=" << g;
    }
    std::mt19937_64 rng(7);
    BlendedOrder fresh(w);  // random jumps, backwards past snapshots included, on a fresh cursor
    for (int k = 0; k < 3000; ++k) {
      const auto g = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      const auto p = fresh.at(g);
      ASSERT_EQ(p.dataset, d[static_cast<size_t>(g)]) << "g=" << g;
      ASSERT_EQ(p.index, j[static_cast<size_t>(g)]) << "g=" << g;
    }
    // The achieved shares follow the weights to within one sample per dataset.
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    std::vector<int64_t> count(w.size(), 0);
    for (int x : d) ++count[static_cast<size_t>(x)];
    for (size_t k = 0; k < w.size(); ++k) EXPECT_NEAR(static_cast<double>(count[k]), w[k] / sum * n, 1.0);
  }
}

TEST(BlendedOrder, RefusesWeightsThatAreNotPositive) {
  EXPECT_TRUE(Contains(error_message([] { BlendedOrder({0.5, 0.0}); }), "weight of dataset 2 is 0"));
  EXPECT_TRUE(Contains(error_message([] { BlendedOrder({-1.0}); }), "finite number > 0"));
}

TEST(BlendedLoader, RowsComeWholeFromTheDatasetTheOrderNames) {
  const int64_t T = 4, B = 3;
  // Dataset 0: 41 tokens = 10 rows; dataset 1: 13 tokens = 3 rows (ids from 1000).
  const std::vector<DataLoader::Dataset> sets = {{iota_tokens(41, 0), 0.6}, {iota_tokens(13, 1000), 0.4}};
  std::vector<int> d;
  std::vector<int64_t> j;
  megatron_blending_indices({0.6, 0.4}, 200 * B, &d, &j);
  for (const bool shuffle : {false, true}) {
    for (const int world : {1, 2, 4}) {
      std::vector<DataLoader> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(sets, B, T, r, world, DataLoader::Order{shuffle, 11});
      std::map<int, std::vector<int64_t>> rows_read;  // per dataset, in order of its samples
      for (int64_t m = 0; m < 200 / world; ++m) {
        for (int r = 0; r < world; ++r) {
          const auto b = ranks[static_cast<size_t>(r)].batch(m);
          EXPECT_FALSE(b.positions.defined());
          EXPECT_EQ(b.counted_all_ranks, -1);
          for (int64_t row = 0; row < B; ++row) {
            const int64_t g = (m * world + r) * B + row;
            const int want = d[static_cast<size_t>(g)];
            const int64_t first = b.inputs[row][0].item<int64_t>();
            ASSERT_EQ(first >= 1000 ? 1 : 0, want) << "sample " << g;
            for (int64_t t = 0; t < T; ++t) {  // T + 1 consecutive tokens of that dataset
              ASSERT_EQ(b.inputs[row][t].item<int64_t>(), first + t);
              ASSERT_EQ(b.targets[row][t].item<int64_t>(), first + t + 1);
            }
            const int64_t start = first - (want ? 1000 : 0);
            ASSERT_EQ(start % T, 0) << "rows start every T tokens";
            const auto ref = ranks[static_cast<size_t>(r)].row(m, r, row);
            EXPECT_EQ(ref.dataset, want);
            EXPECT_EQ(ref.start, start);
            if (!shuffle) {
              ASSERT_EQ(start / T, j[static_cast<size_t>(g)] % (want ? 3 : 10)) << "sample " << g;
            }
            rows_read[want].push_back(start / T);
          }
        }
      }
      // Each dataset's passes read every one of its rows once.
      for (const auto& [set, rows] : rows_read) {
        const size_t R = set ? 3 : 10;
        for (size_t p = 0; p + R <= rows.size(); p += R) {
          const std::set<int64_t> pass(rows.begin() + static_cast<long>(p), rows.begin() + static_cast<long>(p + R));
          EXPECT_EQ(pass.size(), R) << "dataset " << set << " pass " << p / R << (shuffle ? " shuffled" : "");
        }
      }
    }
  }
}

TEST(BlendedLoader, TheSameSamplesWhateverTheRanksAndPassesShuffleDifferently) {
  const std::vector<DataLoader::Dataset> sets = {{iota_tokens(101, 0), 2}, {iota_tokens(61, 5000), 1}};
  auto starts = [&](int world, uint64_t seed) {
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(sets, 2, 5, r, world, DataLoader::Order{true, seed});
    std::vector<int64_t> out;
    for (int64_t k = 0; k < 120; ++k)
      out.push_back(ranks[static_cast<size_t>(k % world)].batch(k / world).inputs[1][0].item<int64_t>());
    return out;
  };
  EXPECT_EQ(starts(1, 3), starts(2, 3));
  EXPECT_EQ(starts(1, 3), starts(4, 3));
  EXPECT_NE(starts(1, 3), starts(1, 4));
}

TEST(BlendedLoaderErrors, ADatasetShorterThanOneSequenceIsNamed) {
  const std::vector<DataLoader::Dataset> sets = {{iota_tokens(100, 0), 1}, {iota_tokens(4, 0), 1}};
  const auto msg = error_message([&] { DataLoader(sets, 2, 4, 0, 1, {}); });
  EXPECT_TRUE(Contains(msg, "has 4 tokens, fewer than one sequence of 5")) << msg;
  EXPECT_TRUE(Contains(msg, "leave it out of data.blend")) << msg;
}
