// Model-state bytes per rank (compute parameters, gradients, fp32 master copies, optimizer states):
// the part of the plan that must equal the trainer's memory.json exactly, so it reads the same flat
// unit layout and ZeRO formula the engine allocates by (parallel/zero/zero_memory.h), on the shards
// a tensor-parallel rank holds; and the ZeRO paper's bare arithmetic for a parameter count alone.
#include "parallel/tensor/tp_layout.h"
#include "parallel/zero/zero_memory.h"
#include "parallel/zero/zero_policies.h"
#include "plan/plan_internal.h"

namespace shardlm::plan {

model::ModelShape rank_shape(const model::LlamaConfig& cfg, int tp) {
  if (tp > 1) parallel::tp::check_tensor_parallel(cfg, tp, false, 0);
  return parallel::tp::sharded_shape(model::describe(cfg), cfg, tp);
}

parallel::FlatLayout rank_layout(const model::LlamaConfig& cfg, int tp, int dp) {
  return parallel::FlatLayout::build(rank_shape(cfg, tp), dp);
}

optim::MasterRounding masters_at(const PlanRequest& r, const std::string& precision) {
  return precision == "bf16" ? optim::parse_master_format(r.master_precision, r.master_rounding)
                             : optim::MasterRounding::None;
}

MemoryBreakdown bare_model_states(int64_t psi, int stage, int dp, const std::string& precision,
                                  const std::string& state_precision, optim::MasterRounding masters) {
  const bool bf16_masters = masters != optim::MasterRounding::None;
  const int64_t c = compute_bytes(precision), master = c < 4 && !bf16_masters ? 4 : 0;
  MemoryBreakdown m;
  m.compute_params = stage == 3 ? c * psi / dp : c * psi;
  m.gradients = stage >= 2 ? c * psi / dp : c * psi;
  m.master_params = stage >= 1 ? master * psi / dp : master * psi;
  const int64_t states = state_precision == "8bit"   ? 2 * psi + 8 * ((psi + 255) / 256)
                         : state_precision == "bf16" ? 4 * psi
                                                     : 8 * psi;
  const int64_t compensation = masters == optim::MasterRounding::Kahan ? 2 * psi : 0;
  m.optimizer_states = stage >= 1 ? (states + compensation) / dp : states + compensation;
  return m;
}

MemoryBreakdown held_model_states(const model::ModelShape& shape, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold,
                                  const std::string& state_precision, int64_t min_8bit_size, bool host_optimizer,
                                  optim::MasterRounding masters, bool states_on_disk,
                                  const ParamOffloadPlan& params) {
  const auto layout = parallel::FlatLayout::build(shape, stage == 0 ? 1 : dp);
  const int64_t c = compute_bytes(precision), g = grad_accum_dtype == "bf16" ? 2 : 4;
  // The engine's policies for this stage and the request's offload, and their bytes by the engine's own
  // sum (parallel/zero/zero_policies.h). host_optimizer: states in host memory apart from the device
  // (states_on_disk: through it from NVMe files); NVMe states in place leave the resident lines later
  // (planner.cpp, states_to_disk).
  const parallel::OffloadChoice offload{host_optimizer, host_optimizer && states_on_disk, /*host_apart=*/true,
                                        params.nvme, params.host};
  const auto policies = parallel::zero_policies(stage, offload);
  const auto z = parallel::policy_memory(
      layout, policies, {c, g, 4, optim::parse_state_precision(state_precision), min_8bit_size, masters},
      persistence_threshold, params.max_in_cpu);
  MemoryBreakdown m;
  m.compute_params = z.compute_params;
  m.gradients = z.gradients;
  m.master_params = z.master_params;
  m.optimizer_states = z.optimizer_states;
  m.host = z.host;
  m.offloaded = z.offloaded;
  return m;
}

MemoryBreakdown model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold, int tp,
                                  const std::string& state_precision, int64_t min_8bit_size, bool host_optimizer,
                                  optim::MasterRounding masters, bool states_on_disk,
                                  const ParamOffloadPlan& params) {
  return held_model_states(rank_shape(cfg, tp), stage, dp, precision, grad_accum_dtype, persistence_threshold,
                           state_precision, min_8bit_size, host_optimizer, masters, states_on_disk, params);
}

OffloadedParams offloaded_parameters(const PlanRequest& r, int shards, const model::ModelShape& rank) {
  OffloadedParams out;
  const auto add = [&](const model::ModelShape& shape, int over) {
    const auto layout = parallel::FlatLayout::build(shape, over);
    const auto off = parallel::stage3_offloaded_units(layout, r.persistence_threshold, r.offload_param_max_in_cpu);
    out.bytes += parallel::offloaded_parameter_bytes(layout, compute_bytes(r.precision), r.persistence_threshold,
                                                     r.offload_param_max_in_cpu);
    for (char o : off) out.units += o;
  };
  if (r.ep > 1) {
    add(expert_parallel_half(rank, r.ep, false), shards);
    add(expert_parallel_half(rank, r.ep, true), shards / r.ep);
  } else {
    add(rank, shards);
  }
  return out;
}

}  // namespace shardlm::plan
