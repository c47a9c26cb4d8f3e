// What the planner's files share and no caller outside src/plan sees: the shapes and layouts one
// rank holds, the per-part activation arithmetic, and the pieces make_plan assembles a Plan from.
// The planner is split by concern (model_states, activations, communication, pipeline, recommend,
// plan_text, plan_json; planner.cpp assembles); this header is the seam between those files, so the
// public header (planner.h) stays the one interface callers include.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_policies.h"
#include "plan/planner.h"
#include "util/units.h"

namespace shardlm::plan {

// Bytes of one value of the compute dtype.
// The number of elements of a tensor of this shape.
inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
inline int64_t compute_bytes(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

inline std::string gb(double bytes) { return util::format_bytes(bytes); }

// --- model states (model_states.cpp) ---

// The parameters one tensor-parallel rank holds (tp = 1: the whole model), and their flat units:
// what the trainer packs after tensor parallelism has replaced the weights by their shards.
model::ModelShape rank_shape(const model::LlamaConfig& cfg, int tp);
parallel::FlatLayout rank_layout(const model::LlamaConfig& cfg, int tp, int dp);
// Model states per rank when the model is given only as a parameter count: the ZeRO paper's
// arithmetic without padding (mixed precision: 2 + 2 + 12 bytes per parameter).
// (Compact optimizer states: bf16 4 bytes per parameter, 8-bit 2 plus 8 per 256-element block.)
MemoryBreakdown bare_model_states(int64_t psi, int stage, int dp, const std::string& precision,
                                  const std::string& state_precision = "fp32",
                                  optim::MasterRounding masters = optim::MasterRounding::None);
// The request's master format at `precision` (bf16 masters exist under bf16 compute only; the planner
// also weighs other precisions, which keep fp32 masters).
optim::MasterRounding masters_at(const PlanRequest& r, const std::string& precision);
// Model-state bytes of what one rank holds (`shape`) by the engine's own formula
// (parallel/zero/zero_memory.h); stage 0 keeps whole units on every rank.
MemoryBreakdown held_model_states(const model::ModelShape& shape, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold,
                                  const std::string& state_precision = "fp32", int64_t min_8bit_size = 4096,
                                  bool host_optimizer = false,
                                  optim::MasterRounding masters = optim::MasterRounding::None,
                                  bool states_on_disk = false, const ParamOffloadPlan& params = {});
// The request's parameter offload (ParamOffloadPlan), for every engine's held_model_states.
inline ParamOffloadPlan param_offload(const PlanRequest& r) {
  return {r.offload_param_host, r.offload_param_nvme, r.offload_param_max_in_cpu};
}
// The parameter shards one rank keeps in files (offload_param nvme, stage 3) over the engines it runs on
// `rank` (the parameters it holds: rank_shape, or its pipeline stage's stage_shape; with expert
// parallelism the dense half over `shards` ranks and the experts' over shards/ep), and in how many unit
// files: what the time model reads and writes per step.
struct OffloadedParams {
  int64_t bytes = 0, units = 0;
};
OffloadedParams offloaded_parameters(const PlanRequest& r, int shards, const model::ModelShape& rank);
// The dense (experts false) or expert half of `shape` with the experts split over ep (experts.cpp).
model::ModelShape expert_parallel_half(model::ModelShape shape, int ep, bool experts);
// The optimizer's buffers apart from the device's, in host memory (offload_optimizer cpu, or nvme
// through the host, on a CUDA run): held_model_states' host_optimizer.
// The positions one rank holds of each sequence (context parallelism splits them over cp ranks).
inline int64_t rank_seq_len(const PlanRequest& r) { return r.seq_len / std::max(1, r.cp); }
// --- context parallelism (context.cpp) ---
// What each of `layers` layers' attention keeps for backward beyond a rank's own positions: p2p and
// all_gather the whole sequence's K and V ([B, T, 2 KV / tp, D]; all_gather also its mask); none
// under full recomputation or all_to_all (whose head split keeps what the estimate counts).
int64_t context_kv_bytes(const PlanRequest& r, int64_t layers, int64_t bytes);
// The K/V exchange's bytes per step (comm_cp_p2p | all_gather | reduce_scatter | all_to_all) of one
// rank running `layers` layers.
std::map<std::string, double> context_comm_bytes(const PlanRequest& r, int64_t layers);
// How the time model prices one of them: the collective, its ranks and its calls per step.
struct ContextCollective {
  std::string base;
  int n = 1;
  double calls = 1;
};
ContextCollective context_collective(const PlanRequest& r, const std::string& op, double layers);
// plan --search's context-parallel sizes among dp ranks beside tp x pp: 1, and every divisor of dp
// that splits the sequence into 2 cp chunks (and, all_to_all, the heads of one tp rank).
std::vector<int> context_parallel_candidates(const PlanRequest& r, int dp, int tp);
inline bool host_optimizer(const PlanRequest& r) { return r.offload_optimizer_host || r.offload_optimizer_nvme_apart; }
// The ZeRO engine's policies for `stage` under the request's offload keys (parallel/zero/
// zero_policies.h): the time model asks them what runs when, as the memory sum asks them what is held.
inline parallel::ZeroPolicies policies_of(const PlanRequest& r, int stage) {
  return parallel::zero_policies(stage, {r.offload_optimizer_host, r.offload_optimizer_nvme, host_optimizer(r),
                                         r.offload_param_nvme, r.offload_param_host});
}

// --- expert parallelism (experts.cpp) ---

// Refuses --ep on a dense model, one that does not divide the experts or dp, or with --shard.
void check_expert_parallel(const PlanRequest& r, int dp);
// Elements of every sparse layer's expert tensors (the whole model's).
int64_t expert_elements(const model::LlamaConfig& cfg);
// Model states with the experts split over ep (r.ep > 1): the replicated part sharded over `shards`
// dp ranks, the E/ep experts over shards/ep (the engines' formula for each half), of `rank`: the
// parameters one rank holds (rank_shape; a pipeline stage's: stage_shape).
void expert_parallel_memory(const PlanRequest& r, int stage, int shards, MemoryBreakdown& m,
                            const model::ModelShape& rank);
// The step's communication with expert parallelism: the dp collectives of the replicated part, the
// edp collectives of the expert slices (edp_*), and the token all_to_alls (ep_all_to_all).
void expert_parallel_comm(const PlanRequest& r, int shards, int64_t rank_parameters, StagePlan& sp);

// --- activations (activations.cpp) ---

// One micro-batch's activations, by part: a decoder layer's, the head's, one residual-stream tensor
// (a pipeline stage's output or input), and what recomputation rebuilds at a time.
struct ActivationParts {
  int64_t layer = 0, head = 0, residual = 0, recompute_peak = 0;
};
ActivationParts activation_parts(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                                 const std::string& recompute, int tp, bool fused_attention, bool sequence_parallel);
// Korthikanti et al. 2022's GPT-layer activation bytes, shown beside this implementation's estimate.
double korthikanti_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t s, int tp, int pp, bool sequence_parallel);
// Plan::activation_method: one sentence on how the activations were estimated.
std::string activation_method(const PlanRequest& r);

// --- communication (communication.cpp) ---

// ZeRO's coalesced reduce-scatter buffers (zero_buckets.h), in bytes of one rank.
int64_t bucket_buffer_bytes(const PlanRequest& r, int stage, int64_t largest_unit, int dp, int64_t bytes);
// Fills sp.comm_bytes and sp.comm_model_multiple for ZeRO stage sp.stage: data parallelism moving
// `psi_bytes` (this rank's parameters in the compute dtype), tensor parallelism, pipeline p2p.
// dp: the ranks ZeRO shards over; replicas: hybrid sharding's shard groups (1: none), whose
// gradient all-reduce moves each rank's `shard_elements` gradients.
void add_step_comm(const PlanRequest& r, int dp, int replicas, double psi_bytes, double shard_elements, StagePlan& sp);

// --- pipeline stages (pipeline.cpp) ---

// The decoder-layer counts of the trainer's split (compute-balanced, or parallelism.pipeline_split),
// per rank (with vpp model chunks per rank, the sum of its chunks'), and per virtual stage.
std::vector<int64_t> stage_layer_counts(const model::LlamaConfig& cfg, int pp, const std::vector<int64_t>& split,
                                        int vpp = 1);
std::vector<int64_t> virtual_stage_layer_counts(const model::LlamaConfig& cfg, int pp, int vpp,
                                                const std::vector<int64_t>& split);
// The parameters one rank of pipeline stage `s` holds, as the trainer leaves them.
model::ModelShape stage_shape(const model::LlamaConfig& cfg, int tp, int pp, int s, const std::vector<int64_t>& split,
                              int vpp = 1);
// Plan::pipeline_stages without their memory: units, layers, parameters, micro-batches alive.
std::vector<PipelineStagePlan> plan_pipeline_stages(const PlanRequest& r);
// One rank of pipeline stage `ps` at ZeRO stage `stage`: model states, activations, backward
// temporaries, comm buffers and the gathered working set.
MemoryBreakdown pipeline_stage_memory(const PlanRequest& r, int dp, const PipelineStagePlan& ps, int stage,
                                      const std::string& precision, const std::string& recompute);
// The schedule's (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1); 0 without a pipeline.
double pipeline_bubble(const PlanRequest& r);

// --- recommendation (recommend.cpp) ---

// Sets p.recommended_* and p.reasons, starting from the requested layout.
void recommend(Plan& p);

}  // namespace shardlm::plan
