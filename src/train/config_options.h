// What each layer takes from a training config, derived in one place: the parallelize() options
// (TP, checkpointing, schedule, DDP/ZeRO knobs in the run's precision), the loss scaler's options
// and the learning-rate schedule. The trainer builds its parts from these and reads no config key
// for them itself.
#pragma once
#include <c10/core/Device.h>

#include "optim/lr_schedule.h"
#include "parallel/parallelize.h"
#include "precision/grad_scaler.h"
#include "train/config.h"

namespace shardlm::train {

parallel::ParallelizeOptions parallelize_options(const TrainConfig& cfg, c10::Device device);
precision::GradScalerOptions grad_scaler_options(const TrainConfig& cfg);
optim::LrSchedule lr_schedule(const TrainConfig& cfg);

}  // namespace shardlm::train
