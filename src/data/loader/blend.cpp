// See blend.h.
#include "data/loader/blend.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace shardlm::data {

BlendedOrder::BlendedOrder(std::vector<double> weights) : w_(std::move(weights)) {
  if (w_.empty()) fail("a data blend needs at least one dataset (internal error)");
  double sum = 0;
  for (size_t d = 0; d < w_.size(); ++d) {
    if (!std::isfinite(w_[d]) || w_[d] <= 0)
      fail("data.blend: the weight of dataset ", d + 1, " is ", w_[d], "; every weight must be a finite number > 0 ",
           "(leave a dataset out instead of giving it weight 0)");
    sum += w_[d];
  }
  for (double& w : w_) w /= sum;
  counts_.assign(w_.size(), 0);
  snapshots_.push_back(counts_);
}

void BlendedOrder::step() {
  const double g = std::max(static_cast<double>(pos_), 1.0);
  int best = 0;
  double best_error = w_[0] * g - static_cast<double>(counts_[0]);
  for (size_t d = 1; d < w_.size(); ++d) {
    const double error = w_[d] * g - static_cast<double>(counts_[d]);
    if (error > best_error) best_error = error, best = static_cast<int>(d);
  }
  last_ = best;
  ++counts_[static_cast<size_t>(best)];
  ++pos_;
  if (pos_ % kSnapshotEvery == 0 && static_cast<size_t>(pos_ / kSnapshotEvery) == snapshots_.size())
    snapshots_.push_back(counts_);
}

BlendedOrder::Pick BlendedOrder::at(int64_t g) {
  if (g < 0) fail("blended sample ", g, " is negative (internal error)");
  if (g < pos_) {  // back to the last snapshot at or before g (the cursor has passed it)
    const int64_t k = g / kSnapshotEvery;
    counts_ = snapshots_[static_cast<size_t>(k)];
    pos_ = k * kSnapshotEvery;
  }
  while (pos_ < g) step();
  step();
  return {last_, counts_[static_cast<size_t>(last_)] - 1};
}

}  // namespace shardlm::data
