// Range checks of config values whose type alone admits nonsense (issue 11): each names the key,
// the value and the valid range, so a typo'd number fails at start-up, not as a NaN hours later.
#pragma once
#include "train/config.h"

namespace shardlm::train {

void check_ranges(const TrainConfig& c);

}  // namespace shardlm::train
