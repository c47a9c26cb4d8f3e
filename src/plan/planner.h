// The planner: bytes per rank by category and communication per step, computed from the same
// flat unit layout the trainer uses (so model-state bytes equal the trainer's memory.json
// exactly), an activation estimate, and a strategy recommendation with one line of reason per step.
// Tensor parallelism is planned on its real layout (parallel/tensor/tp_layout.h: the shards each
// rank holds); pipeline parallelism per stage, on the trainer's split (parallel/pipeline/stage_split.h:
// each stage holds its units' parameters) and its schedule's micro-batches in flight.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/llama_config.h"
#include "model/lora_options.h"
#include "optim/master_format.h"
#include "parallel/zero/zero_defaults.h"
#include "parallel/zero/flat_layout.h"

namespace shardlm::plan {

struct PlanRequest {
  model::LlamaConfig model;
  std::string model_name;
  int64_t params_override = 0;  // > 0: a bare parameter count (model states only: textbook figures)
  int devices = 1;
  double device_memory = 0;     // bytes per device; 0 = unknown
  int64_t micro_batch = 1, seq_len = 2048, accumulation = 1;
  int zero_stage = -1;          // -1: every stage side by side
  int tp = 1, pp = 1;
  // Hybrid sharding (parallelism.hybrid_shard, MiCS): ZeRO shards over groups of this many
  // data-parallel ranks and all-reduces each shard's gradient across the dp / shard groups; 0: ZeRO
  // shards over every data-parallel rank.
  int shard = 0;
  // Expert parallelism (parallelism.expert_parallel): each sparse layer's experts over this many
  // data-parallel ranks (plan/experts.cpp); 1: none.
  int ep = 1;
  // Context parallelism (parallelism.context_parallel): every sequence over this many of the
  // data-parallel ranks (which then count dp x cp, as ZeRO shards over them); each rank's
  // activations are those of seq_len / cp positions plus the other ranks' K/V its attention keeps.
  int cp = 1;
  std::string cp_mode = "p2p";  // parallelism.context_parallel_mode: p2p | all_gather | all_to_all
  std::string pipeline_schedule = "1f1b";  // parallelism.pipeline_schedule: 1f1b | gpipe | interleaved_1f1b | zb_h1
  int virtual_pipeline = 1;                // parallelism.virtual_pipeline_parallel: model chunks per rank
  std::vector<int64_t> pipeline_split;     // parallelism.pipeline_split: layers per stage; empty = balanced
  bool sequence_parallel = false;  // parallelism.sequence_parallel (needs tp > 1)
  std::string precision = "bf16";  // bf16 | fp16 | fp32
  // quantization.load_in_4bit and bnb_4bit_use_double_quant: a LoRA run's frozen base keeps its
  // decoder linears in bitsandbytes' 4-bit form (plan/quantized_base.h frozen_base_bytes).
  bool load_in_4bit = false;
  bool double_quant = false;
  // LoRA (the lora section; plan --lora-r): only the adapters and lora.modules_to_save train, the base
  // is frozen and replicated (MemoryBreakdown::frozen_base); plan/adapters.h.
  bool lora = false;
  model::LoraOptions lora_options;
  std::string recompute = "none";  // none | full | selective (activation_checkpointing.mode)
  // Attention through a fused kernel (flash / memory-efficient, attn_implementation sdpa) keeps no
  // heads x T x T probabilities for backward; the eager path does.
  bool fused_attention = true;
  std::string grad_accum_dtype = "fp32";
  double gradient_clipping = 1.0;  // the time model prices clipping's pass over the gradients when > 0
  // optimizer.state_precision (fp32 | bf16 | 8bit) and optimizer.min_8bit_size: the Adam moments' format.
  std::string optimizer_state_precision = "fp32";
  int64_t min_8bit_size = 4096;
  // optimizer.master_precision (fp32 | bf16) and optimizer.master_rounding (kahan | stochastic | nearest):
  // bf16 masters hold no fp32 copy; Kahan summation adds a bf16 compensation buffer (optim/master_format.h).
  std::string master_precision = "fp32";
  std::string master_rounding = "kahan";
  // zero_optimization.offload_optimizer.device "nvme" (stages 1-3): the fp32 masters and Adam moments
  // live on disk; MemoryBreakdown::offloaded holds their bytes, outside the resident total.
  bool offload_optimizer_nvme = false;
  // zero_optimization.offload_optimizer.device "cpu" with the host buffers apart (a CUDA run, stages
  // 1-3; train/config_options.h host_optimizer_apart): masters, moments and copy staging are host
  // memory, MemoryBreakdown::host, outside the device total.
  bool offload_optimizer_host = false;
  // With offload_optimizer_nvme on a CUDA run (host_optimizer_apart): the masters and moments stream
  // from the files through host staging buffers, which are MemoryBreakdown::host (zero_memory.h
  // zero_state_bytes states_on_disk).
  bool offload_optimizer_nvme_apart = false;
  // zero_optimization.offload_param.device "nvme" (stage 3): the sharded units' compute shards beyond
  // the first max_in_cpu elements live on disk (parallel/zero/zero_memory.h offloaded_parameter_bytes).
  bool offload_param_nvme = false;
  // offload_param.device "cpu" or "nvme" with the shards in host memory apart from the device (a CUDA
  // run, stage 3; train/config_options.h param_offload_apart): parallel/zero/zero_memory.h
  // parameter_shards_to_host moves them to MemoryBreakdown::host.
  bool offload_param_host = false;
  double offload_param_max_in_cpu = 1e9;
  double persistence_threshold = parallel::zero_defaults::kStage3ParamPersistenceThreshold;  // (elements)
  double prefetch = parallel::zero_defaults::kStage3PrefetchBucketSize;  // stage3_prefetch_bucket_size (elements)
  // reduce_bucket_size (elements) of ZeRO's coalesced reduce-scatters (parallel/zero/zero_buckets.h):
  // their buffer pair holds (1 + 1/dp) x min(cap, the rank's largest unit) elements. 0: reductions
  // per unit, no bucket buffers. The trainer's default (DeepSpeed's), as a config without the key runs.
  double reduce_bucket = parallel::zero_defaults::kReduceBucketSize;
  // 16-bit matrix products computed in fp32 (model/fp32_products.h: CPU without bf16 dot products, fp16
  // on CPU): backward's temporaries of the products are fp32 copies beside the 16-bit ones.
  bool products_in_fp32 = false;
};

// Category names are the trainer's memory.json keys.
struct MemoryBreakdown {
  int64_t compute_params = 0, gradients = 0, master_params = 0, optimizer_states = 0;
  int64_t activations = 0, comm_buffers = 0, gathered_peak = 0;
  int64_t recompute_peak = 0;  // activation checkpointing: what backward rebuilds at a time, beyond `activations`
  int64_t backward_peak = 0;   // backward's temporaries beyond the held activations (backward_peak_bytes)
  // ZeRO-3: the part of backward_peak that may land in the heap holes of the gathered units stage 3
  // releases during the step: min(backward_peak, gathered_peak). `total` counts it (the peak when
  // the heap cannot reuse those holes: what must fit); `total - backward_reusable` is the peak when
  // it can. Which one a run sees depends on the order in which the step's blocks are freed (e.g.
  // when an overlapped reduce-scatter lands), not on the configuration. Measured on the demo model,
  // 2 ranks, fp32: 327-336 MB (no reuse; planned 339.1) or 292.6-298.4 MB (reuse; planned 288.8),
  // the second every time with overlap_comm off, by turns with it (AVX2-only and AVX-512 CPUs alike).
  int64_t backward_reusable = 0;
  int64_t offloaded = 0;  // NVMe offload: master + optimizer bytes on disk, in no resident category
  int64_t host = 0;       // offload_optimizer cpu apart: host bytes (zero_memory.h host_optimizer_bytes), ditto
  int64_t frozen_base = 0;  // LoRA: the frozen base's bytes (memory.json's frozen_base), outside the model states
  int64_t model_states() const { return compute_params + gradients + master_params + optimizer_states; }
  int64_t total() const {
    return model_states() + frozen_base + activations + recompute_peak + comm_buffers + gathered_peak + backward_peak;
  }
};

struct StagePlan {
  int stage = 0;
  MemoryBreakdown memory;
  std::map<std::string, double> comm_bytes;  // per step per rank, by operation (message bytes)
  double comm_model_multiple = 0;            // algorithmic volume per step / model bytes (2 = one all-reduce)
  bool fits = true;
  int64_t headroom = 0;                      // device_memory - total (negative: short by)
  // pp > 1: `memory` is this pipeline stage's (the largest total), what must fit device_memory.
  int peak_pipeline_stage = 0;
};

// One pipeline stage (pp > 1): what a rank of it holds.
struct PipelineStagePlan {
  int stage = 0;
  size_t first_unit = 0, last_unit = 0;  // unit range (0 = embedding, 1 + i = layer i, L + 1 = head)
  int64_t layers = 0;                    // decoder layers
  bool embedding_copy = false;           // the last stage's copy of a tied embedding
  int64_t parameters = 0;                // held by one rank (its tensor-parallel shards)
  int64_t micro_batches_alive = 1;       // activations of this many micro-batches at once
  std::vector<MemoryBreakdown> memory;   // one per Plan::stages entry, same order (ZeRO stages)
};

struct Plan {
  PlanRequest request;
  int64_t parameters = 0;
  int64_t rank_parameters = 0;  // held by one tensor-parallel rank (its shards and the replicated rest)
  int dp = 1;
  std::vector<StagePlan> stages;
  std::vector<PipelineStagePlan> pipeline_stages;  // pp > 1 (and a model, not a bare count)
  double pipeline_bubble = 0;  // (p-1)/(m+p-1); interleaved (p-1)/(v·m+p-1)
  std::string activation_method;
  // The recommended layout and why, one line per decision.
  // Starts from the requested layout; a decision changes only what it names.
  int recommended_stage = 0, recommended_tp = 1, recommended_pp = 1;
  bool recommended_sequence_parallel = false;
  std::string recommended_recompute = "none";
  std::vector<std::string> reasons;
};

Plan make_plan(const PlanRequest& request);
// Parameter offload at ZeRO stage 3 (zero_optimization.offload_param), as each ZeRO engine of a rank
// applies it to its own units (a pipeline stage's; expert parallelism's dense and expert halves each):
// host: the sharded units' shards in host memory apart from the device (PlanRequest::offload_param_host);
// nvme: beyond max_in_cpu elements, in files (PlanRequest::offload_param_nvme).
struct ParamOffloadPlan {
  bool host = false, nvme = false;
  double max_in_cpu = 1e9;
};
// Model-state bytes per rank exactly as the trainer allocates them (fp32 / bf16 / fp16 compute), from
// the flat layout of the parameters a tensor-parallel rank holds (tp = 1: the whole model).
MemoryBreakdown model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold, int tp = 1,
                                  const std::string& state_precision = "fp32", int64_t min_8bit_size = 4096,
                                  bool host_optimizer = false,
                                  optim::MasterRounding masters = optim::MasterRounding::None,
                                  bool states_on_disk = false, const ParamOffloadPlan& params = {});
// The tensor-parallel collectives of one optimizer step on one rank, by operation ("tp_all_reduce",
// "tp_all_gather", "tp_reduce_scatter", "tp_kv_all_reduce"), in bytes this rank contributes (each
// call's input, as comm::OpStats counts); empty when tp = 1. Formula in communication.cpp.
std::map<std::string, double> tensor_parallel_comm_bytes(const model::LlamaConfig& cfg, int64_t micro_batch,
                                                         int64_t seq_len, int64_t accumulation,
                                                         const std::string& precision, const std::string& recompute,
                                                         int tp, bool sequence_parallel);
// Activation bytes of one micro-step on one rank: `held` once forward has finished (what backward will read; what the
// trainer measures as activations_held), and `recompute_peak`, what activation checkpointing
// rebuilds at a time during backward.
struct ActivationEstimate {
  int64_t held = 0, recompute_peak = 0;
};
// Without sequence parallelism only the parallel regions' tensors (attention, MLP) are split over tp;
// the residual stream and the norms are replicated (Korthikanti et al. 2022).
ActivationEstimate estimate_activations(const model::LlamaConfig& cfg, int64_t micro_batch, int64_t seq_len,
                                        const std::string& precision, const std::string& recompute, int tp, int pp,
                                        bool fused_attention = true, bool sequence_parallel = false);
// held + recompute_peak: the activations' peak.
int64_t activation_bytes(const model::LlamaConfig& cfg, int64_t micro_batch, int64_t seq_len,
                         const std::string& precision, const std::string& recompute, int tp, int pp,
                         bool fused_attention = true, bool sequence_parallel = false);

// What backward allocates beyond the activations forward left (one micro-batch, one rank), which the
// step's memory peak includes: the loss's gradients (log-probabilities and logits, fp32) and the head
// or embedding weight's gradient before it is accumulated, if this rank runs them; and per decoder
// layer N (2f + 2h) values, the MLP's and attention's gradient blocks that the heap cannot place in
// the holes the freed activations leave (measured with glibc as the trainer sets it up, see
// activations.cpp). `layers`: the decoder layers this rank runs; `head`: it runs the head (and loss).
int64_t backward_peak_bytes(const model::LlamaConfig& cfg, int64_t micro_batch, int64_t seq_len,
                            const std::string& precision, int tp, int64_t layers, bool head, bool embedding,
                            bool products_in_fp32, bool fused_attention = true);

// Pipeline parallelism (pp > 1). Micro-batches whose activations stage `stage` of `pp` holds at once
// (parallel/pipeline/schedule.cpp, its action list run): 1F1B min(pp - stage, m), GPipe all m, ZB-H1
// at most min(pp, m); interleaved (v chunks) its (micro-batch, chunk) pairs / v, rounded up.
int64_t pipeline_micro_batches_alive(const std::string& schedule, int pp, int stage, int64_t micro_batches,
                                     int vpp = 1);
// Model-state bytes of one rank of pipeline stage `pipeline_stage`: the flat layout of the parameters
// it holds (parallel/pipeline/placement.cpp: its units', plus the last stage's copy of a tied
// embedding), tensor-parallel shards, through the same formula as model_state_bytes.
MemoryBreakdown pipeline_model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp,
                                           const std::string& precision, const std::string& grad_accum_dtype,
                                           double persistence_threshold, int tp, int pp, int pipeline_stage,
                                           const std::vector<int64_t>& split = {},
                                           const std::string& state_precision = "fp32", int64_t min_8bit_size = 4096,
                                           int vpp = 1, optim::MasterRounding masters = optim::MasterRounding::None,
                                           bool host_optimizer = false, bool states_on_disk = false,
                                           const ParamOffloadPlan& params = {});
// Activations of one rank of pipeline stage `pipeline_stage` with `micro_batches_alive` micro-batches
// in flight: per micro-batch its layers' tensors, the head's on the last stage, and the stage's output
// (kept until its backward; plus, in 16-bit, the received input); the recompute peak once.
ActivationEstimate estimate_pipeline_stage_activations(const model::LlamaConfig& cfg, int64_t micro_batch,
                                                       int64_t seq_len, const std::string& precision,
                                                       const std::string& recompute, int tp, int pp,
                                                       int pipeline_stage, int64_t micro_batches_alive,
                                                       bool fused_attention = true, bool sequence_parallel = false,
                                                       const std::vector<int64_t>& split = {}, int vpp = 1);

std::string format_plan(const Plan& plan);
nlohmann::json plan_to_json(const Plan& plan);
// A training config (configs/*.json style) for the recommendation.
nlohmann::json recommended_config(const Plan& plan);
// "32GB", "16GiB", "500MB", "1e9" -> bytes.
double parse_bytes(const std::string& text);

}  // namespace shardlm::plan
