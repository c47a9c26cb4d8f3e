// The one interface the trainer drives, whatever parallelize() (parallelize.h) built: DDP or ZeRO
// stages 0-3 over the data-parallel group, with or without tensor parallelism underneath. The
// trainer never asks which; it calls, per optimizer step:
//   (forward with forward_hooks(), model.loss, begin_micro_step, backward) x accumulation, in the
//   order of the step's schedule (pipeline/schedule.h)
//   -> finish_gradients -> grad_norm -> step
// and, for fp16, the loss-scaling calls in between.
#pragma once
#include <nlohmann/json.hpp>
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/consistency.h"
#include "parallel/pipeline/stage_split.h"

namespace shardlm::optim {
class AdamW;
}

namespace shardlm::parallel {

// What a sharded checkpoint (train/checkpoint.h) saves and restores of one rank: the optimizer's
// segments (each a range of one parameter as this rank holds it: the whole tensor, a TP shard, or a
// ZeRO slice "<name>@<first element>"), their fp32 masters and Adam moments.
struct CheckpointView {
  optim::AdamW* optimizer = nullptr;
  // Per segment: the compute-dtype piece when it is not the master itself (bf16/fp16), else undefined.
  std::vector<at::Tensor> working;
  // Whether this rank writes its pieces, so that each is saved once: where the state is the same on
  // every rank of the data-parallel group (DDP, ZeRO-0) only dp rank 0 does; with hybrid sharding
  // only the ranks of the first replica (their shard groups hold every piece once).
  bool saves = true;
  // After the masters and moments were overwritten: refresh what derives from them (compute
  // parameters, gathered units); takes the optimizer steps already taken and the training steps
  // (fp16 skips steps without an update).
  std::function<void(int64_t optimizer_steps, int64_t steps)> loaded;
  // Where the states were paged in from disk for the view (NVMe offload): called once the saved
  // pieces are no longer read, to free that memory again. Null: nothing to do.
  std::function<void()> release;
  // Views of this rank's other optimizers, saved and loaded alike (expert parallelism under ZeRO:
  // the experts' engine, parallel/expert/expert_zero.h); empty otherwise.
  std::vector<CheckpointView> more;
};

// Bytes of model state one rank holds, by category (memory.json's keys; the planner's too).
struct ModelStateMemory {
  int64_t compute_params = 0;      // persistent compute-dtype parameters (full, TP shard or ZeRO shard)
  int64_t gradients = 0;           // persistent gradients (full compute-dtype, or the shard)
  int64_t master_params = 0;       // fp32 master weights (0 when compute is fp32: the shard is the master)
  int64_t optimizer_states = 0;    // Adam exp_avg + exp_avg_sq
  int64_t gathered_peak = 0;       // ZeRO-3: peak bytes of gathered (non-persistent) units
  int64_t padding_elements = 0;
  int64_t offloaded = 0;           // NVMe offload: fp32 master + optimizer bytes on disk, not in total()
  // offload_optimizer cpu with host buffers apart from the device's (a GPU run): the masters, Adam
  // moments and copy staging in host memory, not in total() (zero_memory.h host_optimizer).
  int64_t host = 0;
  int64_t total() const { return compute_params + gradients + master_params + optimizer_states; }
  // memory.json's model-state keys (compute_params ... padding_elements, total_model_states).
  nlohmann::json to_json() const;
  // "model states per rank: params 1 MB, grads ..., = 4 MB (16.00 bytes/param)" for `held` parameters.
  std::string describe(int64_t held) const;
};

// Per unit, after finish_gradients: whether its gradients hold inf/NaN on any rank, and the
// largest |gradient| (unscaled) on any rank: every rank gets the same answer.
struct UnitGradStats {
  bool overflow = false;
  double max_abs = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // One phrase for the start-up line, e.g. "tp=2 x ZeRO stage 3, bf16".
  virtual std::string describe() const = 0;
  // The units this rank runs, per model chunk (a pipeline stage's one run of units, or with
  // interleaved_1f1b its v chunks; the whole model otherwise).
  virtual std::vector<pp::StageUnits> stage_units() const = 0;
  // The hooks the model's forward must be given (ZeRO-3 gathers, per-unit loss scaling), or nullptr.
  virtual model::UnitHooks* forward_hooks() = 0;
  // Before each micro-batch's backward (after its forward: the schedule may run other micro-batches'
  // forwards in between); `boundary` is the step's last backward.
  virtual void begin_micro_step(bool boundary) = 0;
  // After the boundary micro-step's backward: gradients complete and averaged over the data-parallel
  // group, divided by the loss scale the backward ran with.
  virtual void finish_gradients(double loss_scale) = 0;
  // The L2 norm of the whole model's gradient: every shard once, every replicated tensor once.
  virtual double grad_norm() = 0;
  // Clips to max_norm (clip_grad_norm_ semantics; 0: off), updates with AdamW at `lr`, clears gradients.
  virtual void step(double grad_norm, double max_norm, double lr) = 0;

  // fp16 loss scaling (mixed-precision strategies).
  virtual std::vector<UnitGradStats> unit_grad_stats() = 0;
  virtual void skip_step() = 0;
  virtual void set_unit_loss_scales(std::vector<double> scales) = 0;
  virtual std::vector<std::string> unit_names() const = 0;

  // Full HF tensors (names, shapes, fp32 or the training dtype) gathered from every shard; every
  // rank takes part, world rank 0 gets them (other ranks may get undefined tensors) and writes them.
  virtual std::vector<std::pair<std::string, at::Tensor>> full_parameters() = 0;
  virtual ModelStateMemory memory() const = 0;
  // The optimizer when every rank holds the whole model and optimizer; nullptr when the state is
  // sharded. (Checkpoints use checkpoint_view below, which every strategy has.)
  virtual optim::AdamW* replicated_optimizer() { return nullptr; }
  // This rank's state for sharded checkpoints, whatever the layout.
  virtual CheckpointView checkpoint_view() = 0;
  // Communicators whose traffic this strategy adds beyond ParallelDims' (e.g. TP's KV-head groups),
  // with the metrics prefix their bytes are recorded under.
  virtual std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const { return {}; }
  // For the debug consistency checks (consistency.h): the tensors that must be bit-identical over a
  // group of ranks, the gradients after finish_gradients or the parameters after step (live tensors:
  // a test may perturb them). Default: none.
  virtual std::vector<ReplicaSet> replicated_tensors(bool /*gradients*/) { return {}; }
};

}  // namespace shardlm::parallel
