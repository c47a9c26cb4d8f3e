// The step loop: micro-steps with gradient accumulation, data-parallel gradient sync, global-norm
// clipping, the LR schedule, AdamW, evaluation, metrics and the final save. It composes the layers
// below (model, parallel, optim, data, observe) and is itself free of MPI.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "observe/metrics.h"
#include "parallel/strategy.h"
#include "train/config.h"

namespace shardlm::model {
class Llama;
}

namespace shardlm::train {

struct TrainResult {
  std::vector<observe::StepMetrics> history;  // one entry per optimizer step (rank 0 and others alike)
};

class Trainer {
 public:
  // world: every rank of the job (dims are derived from it). quiet: no progress lines (tests).
  Trainer(const TrainConfig& cfg, comm::CommPtr world, bool quiet = false);
  ~Trainer();
  TrainResult run();
  model::Llama& model();
  // This rank's model-state bytes (memory.json holds rank 0's), the measured stage-3 gathered peak included.
  parallel::ModelStateMemory memory() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// With cfg.device_memory set (without it: see check_plan_fits_available_memory), throws an Error holding the plan and the smallest change that fits
// (a higher ZeRO stage, then a smaller micro-batch) when the predicted peak does not fit.
void check_plan_fits(const TrainConfig& cfg, int devices);
// Without device_memory: the same check against what this machine has free per rank
// (util/available_memory.h), the budget and its source named in the error. The launcher passes its
// own resident bytes as per_rank_overhead (each rank process will need as much before it plans).
void check_plan_fits_available_memory(const TrainConfig& cfg, int devices, int ranks_here, int64_t per_rank_overhead);

// Sets libtorch's intra-op threads: `requested`, or the machine's cores divided among the ranks
// that share this node (one thread per core overall).
int configure_threads(int requested);

}  // namespace shardlm::train
