// ZeRO stages 0-3 over flat parameter units (flat_layout.h), with fp32, bf16 or fp16 compute on
// fp32 master weights.
//   stage 0: mixed precision without sharding, as DeepSpeed's bf16/fp16 stage 0: every rank keeps
//            the whole fp32 master and Adam moments; gradients are all-reduced at the boundary.
//            (fp32 stage 0 is the bucketed DataParallel, which overlaps with backward.)
//   stage 1: every rank keeps full compute parameters and gradients; fp32 master weights and Adam
//            moments exist only for its shard. In the backward of the accumulation's last
//            micro-step each unit's gradients are reduce-scattered as soon as they are complete
//            (overlapping the rest of that backward, as DeepSpeed's stage 1 does), the shard is
//            updated, and parameters are all-gathered.
//   stage 2: as each unit's gradients are complete in backward they are copied into a flat buffer
//            and reduce-scattered asynchronously (overlapping the rest of backward), the full
//            gradients are released, and only the gradient shard (grad_accum_dtype) persists.
//            Like DeepSpeed, this happens on every micro-step: deferring to the boundary would need
//            the full gradients kept across micro-steps, which is the memory stage 2 removes.
//   stage 3: additionally, between uses a unit exists only as its shard: the engine is the
//            model's UnitHooks, gathering a unit before its forward (prefetching the next ones),
//            releasing it after, re-gathering it right before its backward (prefetching the unit
//            below) and releasing it once its gradients are reduce-scattered. The last units,
//            which backward's first prefetch would gather again at once, stay gathered from
//            their forward to their backward (choose_units_kept_for_backward).
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
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/host_optimizer.h"
#include "parallel/zero/param_offload.h"
#include "parallel/zero/shard_uploads.h"
#include "parallel/zero/state_offload.h"
#include "parallel/zero/zero_buckets.h"
#include "parallel/zero/zero_gather_buckets.h"
#include "parallel/zero/zero_memory.h"

namespace shardlm::parallel {

struct ZeroOptions {
  int stage = 1;
  // Where every buffer of the engine lives. The model's parameters may be anywhere (the trainer
  // keeps them on the CPU where they were initialised): the engine packs them into units on this
  // device and points the parameters at views of those units.
  c10::Device device = c10::Device(c10::kCPU);
  at::ScalarType compute_dtype = at::kFloat;     // parameters, activations, communicated gradients
  at::ScalarType grad_accum_dtype = at::kFloat;  // the persistent gradient shard (stages 2, 3)
  bool overlap_comm = true;                      // false: wait for each reduce-scatter at once
  int64_t prefetch_numel = 50'000'000;           // stage3_prefetch_bucket_size (elements)
  int64_t persistence_threshold = 100'000;       // stage3_param_persistence_threshold (elements)
  // reduce_bucket_size (elements): consecutive units whose full gradients fit (and fit the largest
  // unit) are reduce-scattered by one collective (zero_buckets.h); stages 1-3. 0 or
  // 0: unit by unit.
  int64_t reduce_bucket_numel = 500'000'000;
  // allgather_bucket_size (elements): after the step, persistent units whose gathered parameters
  // fit are refreshed by one all-gather (zero_gather_buckets.h); stages 1-3.
  int64_t allgather_bucket_numel = 500'000'000;
  // Per-unit loss scaling: the backward signal is rescaled at every unit boundary (see
  // set_unit_loss_scales), so each unit's gradients carry that unit's own scale.
  bool per_unit_loss_scaling = false;
  // Per parameter: the weight of its squared gradient norm in the model's norm (tensor parallelism:
  // 1/replicas, so replicated tensors count once over the TP group); empty: all 1.
  std::vector<double> grad_norm_weights;
  // Hybrid sharding (parallel_dims.h): the ranks holding the same shard in the other shard groups.
  // Units are sharded over the engine's own group only; at the accumulation boundary each reduced
  // gradient shard is summed over these replicas (one all-reduce per unit), so every replica steps
  // on the gradient of the whole data-parallel batch. Null: no replicas.
  comm::CommPtr replicas;
  // Expert parallelism (parallel/expert/expert_zero.h): when not empty, the engine packs only the
  // parameters marked here (the others are left to another engine; units may end up empty), names
  // their optimizer segments from first_element (where this rank's slice starts in the whole tensor;
  // empty: 0), and divides the reduced gradients by average_over ranks instead of its own group's
  // size (the expert gradients' edp sum over all of dp). 0: the data-parallel size.
  std::vector<char> only_params;
  std::vector<int64_t> first_element;
  int average_over = 0;
  // zero_optimization.offload_optimizer.device "nvme" (state_offload.h): fp32 masters (16-bit
  // compute) and Adam moments live in files under offload_nvme_path between steps; stages 1-3.
  bool offload_nvme = false;
  std::string offload_nvme_path;
  std::string offload_files = "states";  // names the files (expert parallelism's second engine: its own)
  // zero_optimization.offload_optimizer.device "cpu" (host_optimizer.h), stages 1-3: the step runs
  // through the host optimizer (chunked, multi-threaded CPU AdamW on the engine's own states).
  bool offload_cpu = false;
  // With offload_cpu (or offload_nvme, whose masters and moments then stream from the files through
  // the host: host_optimizer.h ChunkTransfers): the optimizer's buffers apart from the device's, as a
  // GPU needs them (always on a CUDA device): the masters (fp32 runs too: the device shard is then only the working copy) and
  // moments exist only in host memory (pinned on a GPU), the optimizer reads host gradient buffers
  // the reduced shards are copied into after the norm, clipping and overflow checks ran on the
  // device, and the updated masters are cast back into the device shards. false on a CPU device: the
  // host tensors are the device's, used in place. Tests set it on CPU to run the GPU layout.
  bool host_buffers_apart = false;
  int64_t offload_cpu_chunk_elements = int64_t{1} << 22;  // min(sub_group_size, 2^22)
  int offload_buffer_count = 4;
  int64_t offload_chunk_elements = int64_t{1} << 16;  // min(sub_group_size, 2^16)
  // zero_optimization.offload_param.device "nvme" (param_offload.h), stage 3 only: the compute shards
  // of the sharded units live in files under offload_param_path, except the first units within
  // offload_param_max_in_cpu elements (DeepSpeed's max_in_cpu); no unit's shard may exceed
  // offload_param_buffer_numel elements (buffer_size); the step streams them through
  // offload_param_buffer_count buffers.
  bool offload_param_nvme = false;
  std::string offload_param_path;
  std::string offload_param_files = "params";  // names the files (expert parallelism's second engine: its own)
  int offload_param_buffer_count = 5;
  double offload_param_buffer_numel = 1e8;
  double offload_param_max_in_cpu = 1e9;
  // zero_optimization.offload_param.device "cpu" or "nvme" at stage 3 with the sharded units' compute
  // shards in host memory apart from the device (always on a CUDA device; tests set it on CPU to run
  // the GPU layout): pinned host tensors (nvme: those within max_in_cpu, the rest in files read into
  // host bounce buffers), copied into the unit's slot of the device gather buffer inside the prefetch
  // window (shard_uploads.h) and all-gathered in place. The step updates the host shards: with
  // offload_optimizer "cpu" a host shard of the master's dtype (fp32 compute, bf16 masters) is the host
  // master itself, one buffer (nvme parameters: the master lives in the parameter files), and fp32
  // masters under 16-bit compute are cast straight into it; with "nvme" the paged masters (each piece
  // while its chunk steps; ZeRO-Infinity) are, with no staging buffer; without optimizer offload
  // the fp32 masters and moments stay on the device (fp32 compute too, as DeepSpeed's) and are copied
  // down. false on a CPU device: "cpu" parameters are already in host memory.
  bool offload_param_apart = false;
};

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
  const ParamOffload* param_offload() const { return param_offload_.get(); }  // else null
  const HostOptimizer* host_optimizer() const { return host_optimizer_.get(); }  // else null
  // NVMe offload apart from the device (a GPU run): its gradient and parameter copies, else null.
  const ChunkTransfers* state_transfers() const { return state_moves_.get(); }
  bool parameters_apart() const { return params_apart_; }  // ZeroOptions::offload_param_apart in effect
  void page_in_states();
  void page_out_states(bool write);

 private:
  struct UnitState;
  void gather(size_t unit);          // start (if needed) and complete the all-gather of a unit
  void start_gather(size_t unit);
  void launch_read_gathers(size_t upto);  // parameter offload: gathers whose reads were started, in order
  void step_offloaded_parameters(double lr);  // parameter offload without optimizer offload
  void release(size_t unit);
  void release_after_input_backward(size_t unit);  // zb_h1's B reached `unit`: see zero_engine.cpp
  void prefetch_after(size_t unit, int direction);
  void choose_units_kept_for_backward();
  void on_param_grad_ready(size_t param);
  void reduce_unit_gradients(size_t unit);  // stages 2/3: flat copy + async reduce-scatter
  void start_stage1_reduction(size_t unit);  // stage 1: the boundary's reduce-scatter of a unit
  void complete_reductions(bool all);
  std::unique_ptr<ReduceScatterBuckets> make_reduce_scatter_buckets();
  void refresh_persistent_parameters();
  void reduce_unit_into_bucket(size_t unit);  // stages 2/3 with buckets: copy into the bucket's rows
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
  // The one place that says where a unit's reduced gradient shard (S elements) lives: this rank's
  // slice of the full gradient buffer at stages 0-1, the persistent shard at stages 2-3.
  at::Tensor gradient_shard_of(UnitState& st, int64_t S) const;
  friend struct PreBackwardHook;

  model::Llama& model_;
  comm::CommPtr dp_;
  ZeroOptions options_;
  FlatLayout layout_;
  std::vector<std::unique_ptr<UnitState>> units_;
  std::vector<size_t> unit_of_param_;
  std::unique_ptr<optim::AdamW> adam_;
  optim::AdamWOptions adam_options_;  // the state format (compact moments) for the memory formula
  void share_cut_quantization_blocks();
  std::vector<std::shared_ptr<void>> accumulators_;
  bool sync_ = false;
  std::vector<double> unit_scales_;  // per-unit loss scaling, else empty
  // Stage 1 in fp16 keeps reduced gradients scaled in the fp16 buffer; these factors (per unit,
  // and per optimizer segment) unscale them in fp32 where they are read.
  std::vector<double> unit_unscale_, segment_unscale_;
  std::vector<size_t> segment_unit_, segment_param_;
  int64_t steps_seen_ = 0;  // optimizer steps finished or skipped
  int64_t gathered_now_ = 0, gathered_peak_ = 0;
  // Stage 3, per unit: not released after forward, as its backward gathers it first thing anyway.
  std::vector<char> kept_for_backward_;
  // Stage 3, per unit: the lowest unit whose backward completes its gradients (itself, or a lower
  // unit that also reads it: the tied head's embedding).
  std::vector<size_t> complete_at_;
  std::unique_ptr<ReduceScatterBuckets> rs_buckets_;  // coalesced reductions; null: unit by unit
  std::unique_ptr<AllGatherBuckets> ag_buckets_;      // coalesced parameter refresh (made at first use)
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
  // Parameter offload: the shards' files; the units whose file is being read into their gather buffer
  // (their all-gathers start in this order, alike on every rank); the shards paged in for a checkpoint.
  std::unique_ptr<ParamOffload> param_offload_;
  std::vector<size_t> reading_;
  bool params_paged_in_ = false;
  // ZeroOptions::offload_param_apart: the sharded units' shards are host tensors, each copied into its
  // gather slot by uploads_ (from a bounce buffer where it is read from a file).
  bool params_apart_ = false;
  std::unique_ptr<ShardUploads> uploads_;
};

}  // namespace shardlm::parallel
