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
// offload_optimizer.device "cpu" (or "nvme", whose states then stream through the host) at ZeRO stages
// 1-3 with the host optimizer's buffers apart from the device's (parallel/zero/zero_engine.h
// host_buffers_apart): on a CUDA run; on a CPU run only when the
// test-only environment variable SHARDLM_TEST_OFFLOAD_APART is 1, which runs the GPU layout with plain
// copies (tests/integration/test_host_optimizer_offload.py). The engine and the plan read this alike.
bool host_optimizer_apart(const TrainConfig& cfg);
// offload_param.device "cpu" or "nvme" at stage 3 with the parameter shards in host memory apart from the
// device's gather buffers (parallel/zero/zero_engine.h offload_param_apart): on a CUDA run, and on a CPU
// run under the same test-only SHARDLM_TEST_OFFLOAD_APART=1 (tests/integration/test_param_offload_apart.py).
bool param_offload_apart(const TrainConfig& cfg);
precision::GradScalerOptions grad_scaler_options(const TrainConfig& cfg);
optim::LrSchedule lr_schedule(const TrainConfig& cfg);

}  // namespace shardlm::train
