// The step loop: each step's micro-batches through the schedule parallelize() built (one stage
// without pipeline parallelism), gradient sync, loss scaling, global-norm clipping, the LR schedule,
// AdamW, evaluation, metrics, checkpoints and the final save. It composes the layers below (model,
// parallel, precision, optim, data, observe), is itself free of MPI, and drives every layout and
// precision through the same calls: it holds no branch on either.
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

}  // namespace shardlm::train
