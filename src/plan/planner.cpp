// make_plan: checks a PlanRequest and assembles the Plan from the planner's concerns, one file each
// (model_states, activations, communication, pipeline, recommend; the text and JSON forms in
// plan_text and plan_json; what they share in plan_internal.h): for each ZeRO stage asked for, one
// rank's bytes by category (pp > 1: of every pipeline stage, the largest one what must fit) and its
// communication per step, then the recommendation.
#include <algorithm>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/tensor/tp_layout.h"
#include "parallel/zero/stage3_schedule.h"
#include "plan/adapters.h"
#include "plan/plan_internal.h"
#include "parallel/zero/zero_memory.h"
#include "parallel/zero/zero_policies.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

// Refuses a request the planner cannot plan, naming the option.
void check_request(const PlanRequest& r) {
  if (r.devices < 1) fail("--devices must be >= 1");
  if (r.tp < 1 || r.pp < 1 || r.devices % (r.tp * r.pp) != 0)
    fail("devices ", r.devices, " must be a multiple of tp x pp = ", r.tp * r.pp);
  if (r.precision != "bf16" && r.precision != "fp16" && r.precision != "fp32")
    fail("--precision must be bf16, fp16 or fp32, got '", r.precision, "'");
  optim::parse_master_format(r.master_precision, r.master_rounding);  // names a bad value
  if (r.master_precision == "bf16" && r.precision != "bf16")
    fail("--master-precision bf16 needs --precision bf16 (the bf16 working shard is the master), got '", r.precision,
         "'");
  // bf16 masters with parameter offload on a GPU: the host parameter shards are the host optimizer's masters.
  if (r.master_precision == "bf16" && r.offload_param_host && !r.offload_optimizer_host)
    fail("--master-precision bf16 with parameter offload on a GPU needs the host optimizer (--offload-optimizer cpu, ",
         "zero_optimization.offload_optimizer.device \"cpu\"), whose bf16 masters are the host parameter shards (NVMe ",
         "states would page a second copy of them); set it, leave parameter offload at none, or plan fp32 masters");
  if (r.recompute != "none" && r.recompute != "full" && r.recompute != "selective")
    fail("--recompute must be none, full or selective, got '", r.recompute, "'");
  if (r.params_override == 0 && r.seq_len > r.model.max_position_embeddings)
    fail("--seq-len ", r.seq_len, " exceeds the model's max_position_embeddings ", r.model.max_position_embeddings);
  if (r.params_override == 0) parallel::tp::check_tensor_parallel(r.model, r.tp, r.sequence_parallel, r.seq_len);
  else if (r.sequence_parallel && r.tp == 1) fail("sequence parallelism needs tensor parallelism (--tp > 1)");
  if (r.pipeline_schedule != "1f1b" && r.pipeline_schedule != "gpipe" && r.pipeline_schedule != "interleaved_1f1b" &&
      r.pipeline_schedule != "zb_h1")
    fail("--schedule must be 1f1b, gpipe, interleaved_1f1b or zb_h1, got '", r.pipeline_schedule, "'");
  if (r.params_override == 0)
    parallel::pp::check_schedule(parallel::pp::parse_schedule(r.pipeline_schedule), r.pp, r.virtual_pipeline,
                                 r.accumulation, r.model.num_hidden_layers);
  const int dp = r.devices / (r.tp * r.pp);
  if (r.shard < 0 || (r.shard > 0 && dp % r.shard != 0))
    fail("a shard group of ", r.shard, " data-parallel ranks must divide the ", dp, " data-parallel ranks");
  check_expert_parallel(r, dp);
  if (r.cp < 1 || dp % r.cp != 0)
    fail("--cp ", r.cp, " must divide the ", dp, " ranks beside tp x pp (context-parallel ranks are data-parallel ones)");
  if (r.seq_len % (2 * r.cp) != 0)
    fail("--cp ", r.cp, " splits every sequence into ", 2 * r.cp, " chunks; --seq-len ", r.seq_len, " does not divide");
  if (r.cp_mode != "p2p" && r.cp_mode != "all_gather" && r.cp_mode != "all_to_all")
    fail("--cp-mode must be p2p, all_gather or all_to_all, got '", r.cp_mode, "'");
  check_lora_request(r);
}


// One rank's memory beyond its model states without a pipeline: activations, backward's
// temporaries, ZeRO's comm buffers and stage 3's gathered working set, on `layout` (the rank's units).
void add_rank_memory(const PlanRequest& r, int stage, const parallel::FlatLayout& layout, int slice, int dp,
                     MemoryBreakdown& m) {
  const int64_t c = compute_bytes(r.precision);
  const auto act = estimate_activations(r.model, r.micro_batch, rank_seq_len(r), r.precision, r.recompute, r.tp, r.pp,
                                        r.fused_attention, r.sequence_parallel);
  m.activations = act.held + context_kv_bytes(r, r.model.num_hidden_layers, c);
  m.recompute_peak = act.recompute_peak;
  m.backward_peak = backward_peak_bytes(r.model, r.micro_batch, rank_seq_len(r), r.precision, r.tp,
                                        r.model.num_hidden_layers, true, true, r.products_in_fp32, r.fused_attention);
  const int64_t largest = layout.largest_unit_numel() / slice;
  m.comm_buffers = stage == 0 ? 0 : stage == 1 ? layout.shard_numel() / slice * c : 2 * largest * c;
  m.comm_buffers += bucket_buffer_bytes(r, stage, largest, dp, c);
  if (stage == 3)
    m.gathered_peak = parallel::stage3_gathered_peak_numel(layout, r.prefetch, r.persistence_threshold) / slice * c;
  m.backward_reusable = std::min(m.backward_peak, m.gathered_peak);  // 0 off stage 3
  if (r.lora) set_lora_memory(r, stage, dp, m);
}

}  // namespace

double parse_bytes(const std::string& text) { return util::parse_bytes(text); }

Plan make_plan(const PlanRequest& r) {
  check_request(r);
  Plan p;
  p.request = r;
  p.dp = r.devices / (r.tp * r.pp);
  // The ranks ZeRO shards over: every data-parallel rank, or one shard group (hybrid sharding).
  const int shards = r.shard > 0 ? r.shard : p.dp;
  const bool bare = r.params_override > 0;
  p.parameters = bare ? r.params_override : r.model.num_parameters();
  const int64_t c = compute_bytes(r.precision);
  // The parameters one tensor-parallel rank holds. Pipeline stages hold their own units' parameters
  // (below); for a bare parameter count, pp and tp split them evenly.
  const auto layout = bare     ? parallel::FlatLayout{}
                      : r.lora ? adapter_layout(r, shards)  // LoRA: the trainable tensors are the units' own
                               : rank_layout(r.model, r.tp, shards);
  p.rank_parameters = bare ? p.parameters / r.tp : layout.numel();
  if (r.ep > 1) p.rank_parameters -= expert_elements(r.model) / r.ep * (r.ep - 1);  // E/ep experts each
  const bool pipeline = !bare && r.pp > 1;
  const int slice = bare ? r.tp * r.pp : 1;
  // Pipeline stages: each one's units and parameters, and one rank's memory of it at a ZeRO stage.
  int64_t pipeline_largest_params = 0;
  if (pipeline) {
    p.pipeline_stages = plan_pipeline_stages(r);
    for (const auto& ps : p.pipeline_stages) pipeline_largest_params = std::max(pipeline_largest_params, ps.parameters);
  }
  const double model_bytes = static_cast<double>(bare ? p.parameters : p.rank_parameters) * c;
  p.pipeline_bubble = pipeline_bubble(r);
  p.activation_method = activation_method(r);
  for (int stage = 0; stage <= 3; ++stage) {
    if (r.zero_stage >= 0 && stage != r.zero_stage) continue;
    StagePlan sp;
    sp.stage = stage;
    sp.memory = bare ? bare_model_states(p.parameters, stage, shards, r.precision, r.optimizer_state_precision,
                                         masters_at(r, r.precision))
                     : r.lora ? adapter_model_states(r, stage, shards)
                     : model_state_bytes(r.model, stage, shards, r.precision, r.grad_accum_dtype, r.persistence_threshold,
                                         r.tp, r.optimizer_state_precision, r.min_8bit_size,
                                         host_optimizer(r), masters_at(r, r.precision), r.offload_optimizer_nvme_apart,
                                         param_offload(r));
    if (slice > 1) {
      for (int64_t* v : {&sp.memory.compute_params, &sp.memory.gradients, &sp.memory.master_params,
                         &sp.memory.optimizer_states})
        *v /= slice;
    }
    if (pipeline) {
      // Each pipeline stage on its own; the largest total is what must fit.
      for (auto& ps : p.pipeline_stages) {
        ps.memory.push_back(pipeline_stage_memory(r, shards, ps, stage, r.precision, r.recompute));
        if (r.ep > 1)  // the stage's two halves (expert_zero.h), as the trainer splits them
          expert_parallel_memory(r, stage, shards, ps.memory.back(),
                                 stage_shape(r.model, r.tp, r.pp, ps.stage, r.pipeline_split, r.virtual_pipeline));
        if (ps.stage == 0 || ps.memory.back().total() > sp.memory.total()) {
          sp.memory = ps.memory.back();
          sp.peak_pipeline_stage = ps.stage;
        }
      }
    } else if (!bare) {
      add_rank_memory(r, stage, layout, slice, shards, sp.memory);
    }
    // Parameter offload (stage 3) is in every engine's held model states (model_states.cpp): this rank's
    // units, each pipeline stage's, and with expert parallelism each half's.
    if (r.ep > 1 && !pipeline) expert_parallel_memory(r, stage, shards, sp.memory, rank_shape(r.model, r.tp));
    // NVMe optimizer offload: masters and moments leave the resident bytes (the engine's memory()).
    if (policies_of(r, stage).states == parallel::StatePlacement::Nvme) {
      parallel::states_to_disk(sp.memory);  // as the engine's memory() does
      for (auto& ps : p.pipeline_stages)
        if (!ps.memory.empty()) parallel::states_to_disk(ps.memory.back());
    }
    // Communication per step per rank (message bytes as the trainer counts them: each rank's input).
    // Data parallelism moves this rank's parameters (its tensor-parallel shards).
    // Pipeline: the stage holding the most parameters.
    const double psi_bytes = pipeline ? static_cast<double>(pipeline_largest_params) * c : model_bytes / slice;
    // Hybrid sharding's all-reduce moves this rank's padded gradient shard (the pipeline's busiest
    // stage: its parameters over the shard group).
    const double shard_elements = pipeline ? static_cast<double>(pipeline_largest_params) / shards
                                  : bare   ? static_cast<double>(p.parameters) / slice / shards
                                           : static_cast<double>(layout.shard_numel());
    add_step_comm(r, shards, p.dp / shards, psi_bytes, shard_elements, sp);
    if (r.ep > 1) expert_parallel_comm(r, shards, p.rank_parameters, sp);
    if (r.device_memory > 0) {
      sp.headroom = static_cast<int64_t>(r.device_memory) - sp.memory.total();
      sp.fits = sp.headroom >= 0;
    }
    p.stages.push_back(sp);
  }
  recommend(p);
  return p;
}

}  // namespace shardlm::plan
