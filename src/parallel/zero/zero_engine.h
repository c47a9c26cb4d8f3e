// ZeRO stages 0-3 over flat parameter units (flat_layout.h), with fp32, bf16 or fp16 compute on
// fp32 (or bf16) master weights. The engine composes the three policies a stage chooses
// (zero_policies.h): it packs each unit and hands it to the parameter residency
// (parameter_residency.h: replicated, or stage 3's sharded units gathered and released around their
// use), the gradient reduction (gradient_reduction.h: all-reduce at the boundary, or reduce-scatter
// in the backward of the last micro-step (stage 1) or of every micro-step (stages 2-3)) and the
// optimizer-state placement (state_placement.cpp: device, host or NVMe), and drives the step:
//   stage 0: mixed precision without sharding, as DeepSpeed's bf16/fp16 stage 0: every rank keeps
//            the whole fp32 master and Adam moments; gradients are all-reduced at the boundary.
//            (fp32 stage 0 is the bucketed DataParallel, which overlaps with backward.)
//   stage 1: full compute parameters and gradients; masters and moments only for this rank's shard.
//   stage 2: as stage 1, but only the gradient shard (grad_accum_dtype) persists.
//   stage 3: as stage 2, and between uses a unit exists only as its shard: the engine is the
//            model's UnitHooks, and the residency gathers and releases.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/strategy.h"
#include "parallel/zero/zero_options.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/host_optimizer.h"
#include "parallel/zero/parameter_residency.h"
#include "parallel/zero/state_offload.h"
#include "parallel/zero/gradient_reduction.h"
#include "parallel/zero/zero_memory.h"

namespace shardlm::parallel {

using ZeroMemory = ModelStateMemory;

class ZeroEngine : public model::UnitHooks {
 public:
  // dp: the ranks the units are sharded over (all data-parallel ranks, or with hybrid sharding one
  // shard group; options.replicas then holds the others).
  ZeroEngine(model::Llama& model, comm::CommPtr dp, ZeroOptions options, optim::AdamWOptions adam);
  ~ZeroEngine() override;

  // Before each micro-step's backward; `boundary` is the last micro-step of the accumulation.
  void prepare_backward(bool boundary);
  // After the boundary micro-step's backward: gradient shards complete, averaged over ranks and
  // divided by the loss scale the backward ran with (1 without loss scaling).
  void finish_gradient_sync(double loss_scale = 1.0);
  // Per unit, after finish_gradient_sync: overflow and largest |gradient| over the data-parallel
  // group. Each rank checks its own shard and one MAX all-reduce agrees.
  std::vector<UnitGradStats> unit_grad_stats();
  // After finish_gradient_sync: this rank's averaged gradient shard of unit u (what the optimizer
  // reads), for sums the pipeline adds over stages (the tied embedding's two copies).
  at::Tensor unit_gradient_shard(size_t u);
  // Drops this step's gradients (a skipped step).
  void skip_step();
  // Sum of squares of the (averaged) gradients over all shards of the data-parallel group, each
  // parameter's weighted by grad_norm_weights; its square root is the norm without TP.
  double grad_sum_of_squares();
  // Clips with clip_grad_norm_ semantics, AdamW on the shard, then refreshes compute parameters.
  void step(double grad_norm, double max_norm, double lr);

  // The hooks the model's forward must be given (stage 3, per-unit loss scaling), else nullptr.
  model::UnitHooks* forward_hooks() {
    return options_.stage == 3 || options_.per_unit_loss_scaling ? this : nullptr;
  }
  // Per-unit loss scaling: unit u's gradients are scaled by scales[u]. The loss must be multiplied
  // by scales.back() (the head's); at each boundary the signal is rescaled by scales[u]/scales[u+1].
  void set_unit_loss_scales(std::vector<double> scales) { unit_scales_ = std::move(scales); }
  void before_unit(size_t unit) override;
  at::Tensor after_unit(size_t unit, const at::Tensor& output) override;

  // Full fp32 parameters (HF names, model order), gathered from the master shards on every rank.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();
  const FlatLayout& layout() const { return layout_; }
  // Sharded checkpoints: the optimizer over this rank's master slices; per optimizer segment its
  // compute-dtype piece (undefined where the master is the shard itself); and, after masters and
  // moments were loaded, refreshing the compute parameters from them (as a step's end does).
  optim::AdamW& optimizer() { return *adam_; }
  std::vector<at::Tensor> segment_working_pieces() const;
  void masters_loaded(int64_t optimizer_steps, int64_t steps);
  // Model-state bytes by the formula shared with the planner (zero_memory.h), plus the measured
  // gathered peak.
  ZeroMemory memory() const;
  // NVMe offload (state_offload.h), else null. page_in_states gives the optimizer (and the units'
  // masters) memory holding the offloaded states, for checkpoints; page_out_states writes them back
  // when `write` and frees that memory.
  const StateOffload* state_offload() const { return offload_.get(); }
  const ParamOffload* param_offload() const { return residency_->files(); }  // else null
  const HostOptimizer* host_optimizer() const { return host_optimizer_.get(); }  // else null
  // NVMe offload apart from the device (a GPU run): its gradient and parameter copies, else null.
  const ChunkTransfers* state_transfers() const { return state_moves_.get(); }
  bool parameters_apart() const { return residency_->apart(); }  // ZeroOptions::offload_param_apart in effect
  void page_in_states();
  void page_out_states(bool write);

 private:
  struct UnitState {  // the optimizer-state placement's buffers of one unit (state_placement.cpp)
    at::Tensor master;      // fp32 [S]; the shard itself in fp32 and with bf16 masters (apart: a host parameter shard)
    // Host buffers apart from the device (offload_optimizer cpu on a GPU): the reduced gradient shard's
    // copy [S], and (16-bit compute) the cast parameters waiting for their copy up [S].
    at::Tensor host_grad, host_stage;
  };
  // The optimizer-state placement (state_placement.cpp).
  void place_unit_states(size_t u, const at::Tensor& packed, const at::Tensor& master_full,
                         std::vector<optim::Segment>& segments);
  void start_states(const optim::AdamWOptions& adam, std::vector<optim::Segment> segments, int file_rank);
  void step_states(double lr);
  void step_offloaded_parameters(double lr);  // parameter offload without optimizer offload
  void on_param_grad_ready(size_t param);
  ParamOffload* files() const { return residency_->files(); }  // NVMe parameter shards, else null
  ZeroBytes element_bytes() const;
  void check_memory_formula() const;
  // Ranks the units are sharded over, and this rank's shard: stage 0 keeps whole units.
  int shards() const { return options_.stage == 0 ? 1 : dp_->size(); }
  // Data-parallel ranks the gradients are averaged over: the shard group times its replicas.
  int data_parallel_size() const {
    return options_.average_over > 0 ? options_.average_over
                                     : dp_->size() * (options_.replicas ? options_.replicas->size() : 1);
  }
  bool packs(size_t param) const { return options_.only_params.empty() || options_.only_params[param]; }
  int shard_index() const { return options_.stage == 0 ? 0 : dp_->rank(); }

  model::Llama& model_;
  comm::CommPtr dp_;
  ZeroOptions options_;
  ZeroPolicies policies_;  // the stage as a choice of policies (zero_policies.h)
  FlatLayout layout_;
  std::vector<std::unique_ptr<UnitState>> units_;
  std::vector<size_t> unit_of_param_;
  std::unique_ptr<optim::AdamW> adam_;
  optim::AdamWOptions adam_options_;  // the state format (compact moments) for the memory formula
  void share_cut_quantization_blocks();
  std::vector<std::shared_ptr<void>> accumulators_;
  std::vector<double> unit_scales_;  // per-unit loss scaling, else empty
  // The gradients' buffers and their reduction (the stage's policy).
  std::unique_ptr<GradientReduction> gradients_;
  // Per optimizer segment, the factor that unscales its gradients where they are read
  // (GradientReduction::unscale: fp16 at stage 1 keeps them scaled).
  std::vector<double> segment_unscale_;
  std::vector<size_t> segment_unit_, segment_param_;
  int64_t steps_seen_ = 0;  // optimizer steps finished or skipped
  // Where the units' compute parameters live and how they are gathered (the stage's policy).
  std::unique_ptr<ParameterResidency> residency_;
  // NVMe offload: the states' files; whether masters are separate from the compute shard (16-bit
  // compute), and where each optimizer segment starts in its unit's shard.
  std::unique_ptr<StateOffload> offload_;
  std::unique_ptr<HostOptimizer> host_optimizer_;  // offload_optimizer.device "cpu", else null
  // NVMe offload apart (a GPU run): per state chunk, its gradients down and parameters up; else null.
  std::unique_ptr<ChunkTransfers> state_moves_;
  // NVMe offload: the masters are in the files (16-bit compute's, or apart any run's), not the units'.
  bool masters_offloaded_ = false;
  std::vector<HostShard> host_shards() const;  // per optimizer segment, its device tensors (apart)
  // Unit u's compute shard is its master (fp32 compute, bf16 masters; apart, the host optimizer's).
  bool shard_is_master(size_t u) const;
  // The host optimizer's buffers apart from the device's (ZeroOptions::host_buffers_apart): the units'
  // masters are host tensors and the optimizer's gradients host buffers.
  bool apart_ = false;
  // Per optimizer segment, its reduced gradient where the device holds it (the optimizer's own
  // gradient apart from the device: a host copy): what norms, clipping and the copy down read.
  std::vector<at::Tensor> segment_grads_;
  bool separate_master_ = false;
  std::vector<int64_t> segment_shard_offset_;
};

}  // namespace shardlm::parallel
