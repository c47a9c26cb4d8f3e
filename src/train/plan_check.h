// The planner's view of a training config, and the memory guard built on it: a run that cannot fit
// is refused before it allocates, with the plan and the smallest change that fits. The launcher
// (cli/cmd_train.cpp) checks before starting ranks, the trainer again on every rank.
#pragma once
#include <cstdint>

#include "plan/planner.h"
#include "train/config.h"

namespace shardlm::train {

// The plan request for this run at `zero_stage` and `micro_batch` (the fit search varies those).
plan::PlanRequest plan_request(const TrainConfig& cfg, int devices, int zero_stage, int64_t micro_batch);

// With cfg.device_memory set (without it: see check_plan_fits_available_memory), throws an Error
// holding the plan and the smallest change that fits (a higher ZeRO stage, then a smaller
// micro-batch) when the predicted peak does not fit.
void check_plan_fits(const TrainConfig& cfg, int devices);
// Without device_memory: the same check against what this machine has free per rank
// (util/available_memory.h), the budget and its source named in the error. The launcher passes its
// own resident bytes as per_rank_overhead (each rank process will need as much before it plans).
void check_plan_fits_available_memory(const TrainConfig& cfg, int devices, int ranks_here, int64_t per_rank_overhead);

}  // namespace shardlm::train
