// Learning-rate schedules: constant, and DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// with the curves of the pinned DeepSpeed (0.19.8, deepspeed/runtime/lr_schedules.py), including
// when DeepSpeed's engine evaluates them: the scheduler is built at iteration -1 and stepped after
// each optimizer step, so optimizer step s (0-based) runs with the curve at iteration s - 1 (the
// first step runs at warmup_min_lr for WarmupLR/WarmupDecayLR and at 0 for WarmupCosineLR).
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::optim {

// DeepSpeed's scheduler section (type and params), with DeepSpeed's defaults: the training config's
// `scheduler`, whose keys bind these fields (src/train/keys/optimizer.cpp).
struct SchedulerConfig {
  std::string type = "constant";  // "constant" | "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"
  int64_t warmup_num_steps = 1000;  // W (DeepSpeed uses max(2, W))
  double warmup_min_ratio = 0.0;    // WarmupCosineLR: warm-up starts at base_lr * this ratio
  double cos_min_ratio = 1e-4;      // WarmupCosineLR: floor = base_lr * this ratio
  int64_t total_num_steps = 0;      // WarmupDecayLR / WarmupCosineLR: S; 0: the run's steps
  double warmup_min_lr = 0.0;       // WarmupLR / WarmupDecayLR: the lr the warm-up starts from
  double warmup_max_lr = 1e-3;      // WarmupLR / WarmupDecayLR: the lr the warm-up reaches (absent with
                                    // WarmupLR: the optimizer's lr, train/config_deepspeed.cpp, as DeepSpeed)
  std::string warmup_type = "log";  // "log" | "linear"
};

// The schedule of a run: its scheduler section, the optimizer's lr and the run's steps.
struct LrSchedule {
  SchedulerConfig params;
  double base_lr = 1e-3;  // constant: the lr; WarmupCosineLR: the optimizer's lr it scales
  int64_t steps = 1;      // the run's steps: S when params.total_num_steps is 0

  // LR used by optimizer step `step` (0-based): the curve at DeepSpeed's iteration i = step - 1.
  //   warm-up (i < W):  log: log(i + 1) / log(W);  linear: i / W
  //   WarmupLR:         min_lr + (max_lr - min_lr) * gamma, gamma = warm-up then 1 (min_lr at i < 0)
  //   WarmupDecayLR:    the same, gamma = max(0, (S - i) / max(1, S - W)) after the warm-up
  //   WarmupCosineLR:   base_lr * ratio; warm-up ratio = r0 + (1 - r0) * warm-up; then
  //                     max(0, rmin + (1 - rmin) (1 + cos(pi min(1, (i - W + 1) / max(1, S - W)))) / 2); 0 at i < 0
  double lr_at(int64_t step) const;
  // The curve at DeepSpeed's iteration i (lr_at(step) is at(step - 1)).
  double at(int64_t iteration) const;
};

}  // namespace shardlm::optim
