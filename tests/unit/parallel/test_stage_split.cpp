// The pipeline's default split (parallel/pipeline/stage_split.h): the largest stage's compute is the
// smallest any split of consecutive layers achieves (checked against every split), the even split
// is kept when it is as good, and an explicit pipeline_split is taken as given or refused.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "model/llama_config.h"
#include "parallel/pipeline/stage_split.h"
#include "util/error.h"

namespace shardlm::parallel::pp {
namespace {

model::LlamaConfig shape(int64_t layers, int64_t vocab) {
  auto c = model::preset("tiny");  // hidden 64, MLP 176, 4 heads, 2 KV heads
  c.num_hidden_layers = layers;
  c.vocab_size = vocab;
  return c;
}

double largest(const std::vector<int64_t>& counts, const UnitCosts& costs) {
  const auto c = stage_costs(counts, costs);
  return *std::max_element(c.begin(), c.end());
}

// The smallest largest-stage cost over every split of `layers` into `stages` runs of >= 1 layer.
double best_by_enumeration(int64_t layers, int stages, const UnitCosts& costs) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> counts;
  std::function<void(int64_t)> place = [&](int64_t left) {
    if (static_cast<int>(counts.size()) == stages - 1) {
      if (left < 1) return;
      counts.push_back(left);
      best = std::min(best, largest(counts, costs));
      counts.pop_back();
      return;
    }
    for (int64_t n = 1; n <= left - (stages - 1 - static_cast<int64_t>(counts.size())); ++n) {
      counts.push_back(n);
      place(left - n);
      counts.pop_back();
    }
  };
  place(layers);
  return best;
}

TEST(StageSplit, CostsFollowTheShapes) {
  const auto c = unit_costs(shape(2, 4096));
  // 2 flops per multiply-add: q, o 64x64; k, v 64x32; gate, up, down 64x176.
  EXPECT_DOUBLE_EQ(c.layer, 2.0 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176));
  EXPECT_DOUBLE_EQ(c.head, 2.0 * 64 * 4096 + 5 * 4096);
  EXPECT_GT(c.head, 5 * c.layer);  // a small model's large vocabulary
}

TEST(StageSplit, EvenWhenTheHeadIsLight) {
  const auto model = shape(4, 128);
  EXPECT_EQ(layer_counts(model, 2, {}), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(layer_counts(model, 4, {}), (std::vector<int64_t>{1, 1, 1, 1}));
  // The remainder goes to the middle stages when that is as balanced.
  EXPECT_EQ(layer_counts(shape(6, 128), 4, {}), (std::vector<int64_t>{1, 2, 2, 1}));
}

TEST(StageSplit, AHeavyHeadTakesLayersOffTheLastStage) {
  // The head costs about 5.9 layers: stage 1 keeps one layer, stage 0 the other seven.
  EXPECT_EQ(layer_counts(shape(8, 4096), 2, {}), (std::vector<int64_t>{7, 1}));
}

TEST(StageSplit, NoSplitOfConsecutiveLayersIsBetterBalanced) {
  for (int64_t vocab : {128, 1024, 4096, 32000})
    for (int64_t layers : {2, 3, 5, 8, 11})
      for (int stages = 1; stages <= std::min<int64_t>(layers, 5); ++stages) {
        const auto model = shape(layers, vocab);
        const auto counts = layer_counts(model, stages, {});
        ASSERT_EQ(static_cast<int>(counts.size()), stages);
        EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), layers);
        for (auto n : counts) EXPECT_GE(n, 1);
        EXPECT_DOUBLE_EQ(largest(counts, unit_costs(model)), best_by_enumeration(layers, stages, unit_costs(model)))
            << "vocab " << vocab << ", " << layers << " layers, " << stages << " stages";
      }
}

TEST(StageSplit, AnExplicitSplitIsTakenOrRefused) {
  const auto model = shape(4, 4096);
  EXPECT_EQ(layer_counts(model, 2, {1, 3}), (std::vector<int64_t>{1, 3}));
  EXPECT_THROW(layer_counts(model, 2, {2, 1}), Error);     // sums to 3, not 4
  EXPECT_THROW(layer_counts(model, 2, {4, 0}), Error);     // an empty stage
  EXPECT_THROW(layer_counts(model, 3, {2, 2}), Error);     // two counts for three stages
  EXPECT_THROW(layer_counts(model, 5, {}), Error);         // more stages than layers
}

}  // namespace
}  // namespace shardlm::parallel::pp
