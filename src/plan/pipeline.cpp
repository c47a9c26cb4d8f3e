// Pipeline parallelism in the plan (pp > 1): the trainer's split of the decoder layers into stages
// (parallel/pipeline/stage_split.h), what one rank of each stage holds (its units' parameters, the
// last stage's copy of a tied embedding), how many micro-batches its schedule keeps alive, and that
// rank's memory at a ZeRO stage; the bubble. Memory is planned per stage because the largest one
// is what must fit the device. With interleaved_1f1b a rank holds v chunks of L / (p·v) layers
// (chunk c of rank s is virtual stage c·p + s); micro-batches alive come from the schedule's own
// action lists (parallel/pipeline/schedule.h's simulate_schedule).
#include <algorithm>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/tensor/tp_layout.h"
#include "parallel/zero/stage3_schedule.h"
#include "plan/plan_internal.h"

namespace shardlm::plan {

std::vector<int64_t> virtual_stage_layer_counts(const model::LlamaConfig& cfg, int pp, int vpp,
                                                const std::vector<int64_t>& split) {
  if (vpp <= 1) return parallel::pp::layer_counts(cfg, pp, split);
  return std::vector<int64_t>(pp * vpp, cfg.num_hidden_layers / (pp * vpp));  // parallelize.cpp's even split
}

std::vector<int64_t> stage_layer_counts(const model::LlamaConfig& cfg, int pp, const std::vector<int64_t>& split,
                                        int vpp) {
  const auto counts = virtual_stage_layer_counts(cfg, pp, vpp, split);
  std::vector<int64_t> per_rank(pp, 0);
  for (size_t k = 0; k < counts.size(); ++k) per_rank[k % pp] += counts[k];
  return per_rank;
}

// The parameters one rank of pipeline stage `s` holds, as the trainer leaves them
// (parallel/pipeline/placement.cpp): its units' tensor-parallel shards, every other parameter
// emptied to {0}; on the last stage, with tied embeddings, also its own copy of the embedding.
model::ModelShape stage_shape(const model::LlamaConfig& cfg, int tp, int pp, int s, const std::vector<int64_t>& split,
                              int vpp) {
  if (tp > 1) parallel::tp::check_tensor_parallel(cfg, tp, false, 0);
  auto shape = parallel::tp::sharded_shape(model::describe(cfg), cfg, tp);
  const auto counts = virtual_stage_layer_counts(cfg, pp, vpp, split);
  std::vector<bool> held(shape.params.size(), false);
  for (int c = 0; c < std::max(1, vpp); ++c) {
    const auto units = parallel::pp::stage_units(counts, c * pp + s);
    for (size_t u = units.first; u <= units.last; ++u)
      for (size_t i : shape.units[u].params) held[i] = true;
  }
  if (cfg.tie_word_embeddings && pp > 1 && s == pp - 1) held[0] = true;
  for (size_t i = 0; i < shape.params.size(); ++i)
    if (!held[i]) shape.params[i].second = {0};
  return shape;
}

int64_t pipeline_micro_batches_alive(const std::string& schedule, int pp, int stage, int64_t m, int vpp) {
  // The schedule's action list, run (schedule.cpp): 1F1B min(p - s, m) at the peak (p - s - 1
  // warm-up forwards, then one more forward before each backward); GPipe all m; ZB-H1 keeps each
  // micro-batch until its W, at most min(p, m) on any stage (1F1B's stage 0). Interleaved counts
  // (micro-batch, chunk) pairs of L / (p·v) layers each: rounded up to whole stages' worth.
  namespace pp_ = parallel::pp;
  const int v = std::max(1, vpp);
  const auto sim = pp_::simulate_schedule(pp_::parse_schedule(schedule), pp, m, v, std::vector<pp_::ActionCost>(pp * v));
  return (sim.max_alive.at(stage) + v - 1) / v;
}

MemoryBreakdown pipeline_model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp,
                                           const std::string& precision, const std::string& grad_accum_dtype,
                                           double persistence_threshold, int tp, int pp, int pipeline_stage,
                                           const std::vector<int64_t>& split, const std::string& state_precision,
                                           int64_t min_8bit_size, int vpp, optim::MasterRounding masters,
                                           bool host_optimizer, bool states_on_disk,
                                           const ParamOffloadPlan& params) {
  return held_model_states(stage_shape(cfg, tp, pp, pipeline_stage, split, vpp), stage, dp, precision, grad_accum_dtype,
                           persistence_threshold, state_precision, min_8bit_size, host_optimizer, masters,
                           states_on_disk, params);
}

ActivationEstimate estimate_pipeline_stage_activations(const model::LlamaConfig& cfg, int64_t b, int64_t T,
                                                       const std::string& precision, const std::string& recompute,
                                                       int tp, int pp, int s, int64_t alive, bool fused_attention,
                                                       bool sequence_parallel, const std::vector<int64_t>& split,
                                                       int vpp) {
  // Per micro-batch in flight (schedule.cpp keeps each one's input and output until its backward):
  // the stage's layers; the head on the last stage; the output sent on (a residual-stream tensor
  // no op of this stage saves; on stage 0 the embedding's path ends there); the received input in
  // 16-bit (in fp32 it is the tensor the first norm saves, already counted).
  const auto a = activation_parts(cfg, b, T, precision, recompute, tp, fused_attention, sequence_parallel);
  const auto counts = stage_layer_counts(cfg, pp, split, vpp);
  int64_t per = counts[s] * a.layer;
  if (s == pp - 1) per += a.head;
  if (s < pp - 1) per += a.residual;
  if (s > 0 && compute_bytes(precision) < 4) per += a.residual;
  return {alive * per, a.recompute_peak};
}

std::vector<PipelineStagePlan> plan_pipeline_stages(const PlanRequest& r) {
  std::vector<PipelineStagePlan> stages;
  const int v = std::max(1, r.virtual_pipeline);
  const auto counts = virtual_stage_layer_counts(r.model, r.pp, v, r.pipeline_split);
  for (int s = 0; s < r.pp; ++s) {
    PipelineStagePlan ps;
    ps.stage = s;
    // The first chunk's first unit to the last chunk's last (the units between belong to other ranks).
    ps.first_unit = parallel::pp::stage_units(counts, s).first;
    ps.last_unit = parallel::pp::stage_units(counts, (v - 1) * r.pp + s).last;
    ps.layers = 0;
    for (int c = 0; c < v; ++c) ps.layers += counts[c * r.pp + s];
    ps.embedding_copy = r.model.tie_word_embeddings && s == r.pp - 1;
    ps.parameters =
        parallel::FlatLayout::build(stage_shape(r.model, r.tp, r.pp, s, r.pipeline_split, v), 1).numel();
    ps.micro_batches_alive = pipeline_micro_batches_alive(r.pipeline_schedule, r.pp, s, r.accumulation, v);
    stages.push_back(ps);
  }
  return stages;
}

MemoryBreakdown pipeline_stage_memory(const PlanRequest& r, int dp, const PipelineStagePlan& ps, int stage,
                                      const std::string& precision, const std::string& recompute) {
  auto m = pipeline_model_state_bytes(r.model, stage, dp, precision, r.grad_accum_dtype, r.persistence_threshold,
                                      r.tp, r.pp, ps.stage, r.pipeline_split, r.optimizer_state_precision,
                                      r.min_8bit_size, r.virtual_pipeline, masters_at(r, precision), host_optimizer(r),
                                      r.offload_optimizer_nvme_apart, param_offload(r));
  const auto act = estimate_pipeline_stage_activations(r.model, r.micro_batch, rank_seq_len(r), precision, recompute, r.tp,
                                                       r.pp, ps.stage, ps.micro_batches_alive, r.fused_attention,
                                                       r.sequence_parallel, r.pipeline_split, r.virtual_pipeline);
  m.activations = act.held + context_kv_bytes(r, ps.layers, compute_bytes(precision)) * ps.micro_batches_alive;
  m.recompute_peak = act.recompute_peak;
  m.backward_peak = backward_peak_bytes(r.model, r.micro_batch, rank_seq_len(r), precision, r.tp, ps.layers,
                                        ps.stage == r.pp - 1, ps.stage == 0, r.products_in_fp32, r.fused_attention);
  const auto stage_layout =
      parallel::FlatLayout::build(stage_shape(r.model, r.tp, r.pp, ps.stage, r.pipeline_split, r.virtual_pipeline), dp);
  const int64_t largest = stage_layout.largest_unit_numel(), cb = compute_bytes(precision);
  m.comm_buffers = stage == 0 ? 0 : stage == 1 ? stage_layout.shard_numel() * cb : 2 * largest * cb;
  m.comm_buffers += bucket_buffer_bytes(r, stage, largest, dp, cb);
  if (stage == 3)
    m.gathered_peak = parallel::stage3_gathered_peak_numel(stage_layout, r.prefetch, r.persistence_threshold,
                                                           ps.first_unit, ps.last_unit, ps.micro_batches_alive) *
                      cb;
  m.backward_reusable = std::min(m.backward_peak, m.gathered_peak);  // 0 off stage 3
  return m;
}

double pipeline_bubble(const PlanRequest& r) {
  if (r.pp <= 1) return 0;
  return parallel::pp::schedule_bubble(parallel::pp::parse_schedule(r.pipeline_schedule), r.pp, r.accumulation,
                                       std::max(1, r.virtual_pipeline));
}

}  // namespace shardlm::plan
