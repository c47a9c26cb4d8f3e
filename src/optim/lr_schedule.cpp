// See lr_schedule.h. Each expression keeps DeepSpeed's order of operations (lr_schedules.py,
// pinned 0.19.8) so that the values agree to the last bit: tests/unit/optim/test_lr_schedule.cpp
// compares them with tests/golden/deepspeed_lr.json, made by DeepSpeed's own classes.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace shardlm::optim {

double LrSchedule::lr_at(int64_t step) const { return at(step - 1); }

double LrSchedule::at(int64_t i) const {
  const std::string &type = params.type, &warmup_type = params.warmup_type;
  const int64_t warmup_steps = params.warmup_num_steps;
  const int64_t total_steps = params.total_num_steps > 0 ? params.total_num_steps : steps;
  const double warmup_min_ratio = params.warmup_min_ratio, cos_min_ratio = params.cos_min_ratio;
  const double warmup_min_lr = params.warmup_min_lr, warmup_max_lr = params.warmup_max_lr;
  if (type == "constant") return base_lr;
  const int64_t w = std::max<int64_t>(2, warmup_steps);  // self.warmup_num_steps = max(2, warmup_num_steps)
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(w));
  const auto warm = [&]() {
    return warmup_type == "linear" ? static_cast<double>(i) / static_cast<double>(w)
                                   : inverse_log_warm_up * std::log(static_cast<double>(i + 1));
  };
  if (type == "WarmupCosineLR") {
    if (i < 0) return 0.0;  // get_lr before the first step: [0.0 for _ in org_lrs]
    double ratio;
    if (i < w) {
      ratio = warm();
      const double ratio_delta = 1. - warmup_min_ratio;
      ratio = warmup_min_ratio + ratio * ratio_delta;
    } else {
      const double real_last_step = static_cast<double>(i - w + 1);
      const double real_total_steps = static_cast<double>(std::max<int64_t>(1, total_steps - w));
      const double cosine_progress = std::min(1.0, real_last_step / real_total_steps);
      const double ratio_delta = 1. - cos_min_ratio;
      ratio = (1 + std::cos(M_PI * cosine_progress)) / 2;
      ratio = std::max(0.0, cos_min_ratio + ratio_delta * ratio);
    }
    return base_lr * ratio;
  }
  // WarmupLR / WarmupDecayLR: min_lr + delta_lr * gamma.
  if (i < 0) return warmup_min_lr;  // get_lr before the first step: min_lrs
  const double delta_lr = warmup_max_lr - warmup_min_lr;
  double gamma = 1.0;
  if (i < w) {
    gamma = warm();
  } else if (type == "WarmupDecayLR") {
    gamma = std::max(0.0, static_cast<double>(total_steps - i) /
                              std::max(1.0, static_cast<double>(total_steps - w)));
  }
  return warmup_min_lr + (delta_lr * gamma);
}

}  // namespace shardlm::optim
