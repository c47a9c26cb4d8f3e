#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace shardlm::optim {

double LrSchedule::lr_at(int64_t step) const {
  if (type == "constant") return base_lr;
  if (step < warmup_steps)
    return base_lr * (warmup_min_ratio + (1.0 - warmup_min_ratio) * double(step + 1) / double(warmup_steps));
  const double progress = double(step - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
  return base_lr * (cos_min_ratio + (1.0 - cos_min_ratio) * cosine);
}

}  // namespace shardlm::optim
