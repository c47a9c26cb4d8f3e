// Range checks of config values (config_ranges.h); load_train_config runs them after reading.
#include "train/config_ranges.h"

#include <cmath>

#include "util/error.h"

namespace shardlm::train {

void check_ranges(const TrainConfig& c) {
  const auto& o = c.optimizer;
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
    fail("optimizer.params.betas must both lie in [0, 1), got [", o.beta1, ", ", o.beta2, "] (e.g. [0.9, 0.95])");
  if (!(o.weight_decay >= 0)) fail("optimizer.params.weight_decay must be >= 0, got ", o.weight_decay);
  if (!std::isfinite(o.lr)) fail("optimizer.params.lr must be a finite number, got ", o.lr);
  if (!(c.gradient_clipping >= 0))
    fail("gradient_clipping must be >= 0 (0 disables clipping), got ", c.gradient_clipping);
  const auto& s = c.scheduler;
  if (s.warmup_num_steps < 0) fail("scheduler.params.warmup_num_steps must be >= 0, got ", s.warmup_num_steps);
  if (s.total_num_steps < 0) fail("scheduler.params.total_num_steps must be >= 0 (0: the run's steps), got ", s.total_num_steps);
  if (!(s.warmup_min_ratio >= 0 && s.warmup_min_ratio <= 1) || !(s.cos_min_ratio >= 0 && s.cos_min_ratio <= 1))
    fail("scheduler.params.warmup_min_ratio and cos_min_ratio must lie in [0, 1], got ", s.warmup_min_ratio, " and ",
         s.cos_min_ratio);
  if (c.threads < 0) fail("threads must be >= 0 (0: cores / local ranks), got ", c.threads);
  if (c.data.eval_batches < 1)
    fail("data.eval_batches must be >= 1 (micro-batches per rank per evaluation), got ", c.data.eval_batches,
         "; to skip validation set data.val to \"\"");
  if (!(c.device_memory >= 0)) fail("device_memory must be >= 0 (0: no limit), got ", c.device_memory);
  if (!(c.zero.reduce_bucket_size > 0) || !(c.zero.allgather_bucket_size > 0))
    fail("zero_optimization.reduce_bucket_size and allgather_bucket_size must be positive (elements)");
  for (const auto& [key, value] : {std::pair{"stage3_prefetch_bucket_size", c.zero.stage3_prefetch_bucket_size},
                                    {"stage3_param_persistence_threshold", c.zero.stage3_param_persistence_threshold}})
    if (!(value >= 0) || value != std::floor(value))
      fail("zero_optimization.", key, " must be a whole number of elements >= 0 (e.g. 5e7), got ", value);
  if (c.fp16.enabled && (c.fp16.initial_scale_power < 0 || c.fp16.initial_scale_power > 64))
    fail("fp16.initial_scale_power must lie in [0, 64] (the first scale is 2^power), got ", c.fp16.initial_scale_power);
}

}  // namespace shardlm::train
