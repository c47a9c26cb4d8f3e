// Weighted blending of several training datasets, as Megatron-LM's BlendedDataset orders them: a
// user who trains on "70% web text, 30% code" gives each token file a weight, and global sample g
// (one sequence) is drawn from the dataset whose share so far lags its weight the most. The rule is
// Megatron-Core's build_blending_indices (megatron/core/datasets/helpers.cpp), greedy error
// minimisation over normalised weights w_d = weight_d / sum(weights):
//   for g = 0, 1, ...: d(g) = the first d maximising w_d * max(g, 1) - n_d(g), where n_d(g) counts
//   the samples before g drawn from d; sample g is d's sample n_d(g).
// So the order is a pure function of the sample index and the weights (no RNG), identical to
// Megatron's for the same weights, and the same whatever the data-parallel size.
//
// Megatron materialises the index arrays for the whole run (9 bytes per sample); this cursor keeps
// the counts n_d at every kSnapshotEvery-th sample it passed instead, so any sample is found by at
// most kSnapshotEvery steps from a snapshot and a run resumed at sample g walks from 0 once.
#pragma once
#include <cstdint>
#include <vector>

namespace shardlm::data {

class BlendedOrder {
 public:
  // weights: one per dataset, each finite and > 0 (normalised here, as Megatron does in float64).
  explicit BlendedOrder(std::vector<double> weights);

  struct Pick {
    int dataset = 0;
    int64_t index = 0;  // the dataset's own sample number (0, 1, ... as it is drawn)
  };
  // Where global sample g comes from. Not thread-safe (a cursor moves): one caller at a time.
  Pick at(int64_t g);

  const std::vector<double>& weights() const { return w_; }  // normalised
  static constexpr int64_t kSnapshotEvery = 4096;

 private:
  void step();  // draws sample pos_ and moves the cursor past it
  std::vector<double> w_;
  std::vector<int64_t> counts_;                  // n_d(pos_)
  int64_t pos_ = 0;
  std::vector<std::vector<int64_t>> snapshots_;  // [k] = n_d(k * kSnapshotEvery)
  int last_ = 0;                                 // the dataset step() drew last
};

}  // namespace shardlm::data
