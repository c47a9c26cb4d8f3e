// Learning-rate schedules: constant, and linear warmup followed by cosine decay to a floor.
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::optim {

struct LrSchedule {
  std::string type = "constant";  // "constant" | "WarmupCosineLR"
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  double warmup_min_ratio = 0.0;  // warmup starts at base_lr * this ratio
  double cos_min_ratio = 0.1;     // floor = base_lr * this ratio
  int64_t total_steps = 1;

  // LR used by optimizer step `step` (0-based). WarmupCosineLR:
  //   step < W:  base * (r0 + (1 - r0) * (step + 1) / W)
  //   else:      base * (rmin + (1 - rmin) * 0.5 * (1 + cos(pi * (step - W) / max(1, total - W))))
  double lr_at(int64_t step) const;
};

}  // namespace shardlm::optim
