// Expert parallelism in the plan (parallel/expert/expert_parallel.h, expert_zero.h): a rank holds the
// replicated parameters sharded over dp as without it, plus E/ep experts of every sparse layer
// sharded over the dp/ep ranks holding them (edp) by a second ZeRO engine, so its model states are
// the engine formula (held_model_states) over those two halves; and each sparse layer moves its
// routed rows by all_to_all, twice forward (dispatch, combine) and twice backward.
#include "plan/plan_internal.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

bool expert_tensor(const std::string& name) {
  return name.find(".mlp.experts.gate_up_proj") != std::string::npos ||
         name.find(".mlp.experts.down_proj") != std::string::npos;
}

// A rank's shape (the whole model's, or a pipeline stage's) with only the experts (their E/ep slice)
// or only the rest in its units.
model::ModelShape half(model::ModelShape shape, int ep, bool experts) {
  for (auto& [name, dims] : shape.params)
    if (expert_tensor(name)) dims[0] /= ep;
  for (auto& u : shape.units) {
    std::vector<size_t> kept;
    for (size_t i : u.params)
      if (expert_tensor(shape.params[i].first) == experts) kept.push_back(i);
    u.params = kept;
  }
  return shape;
}

int64_t sparse_layers(const model::LlamaConfig& cfg) {
  int64_t n = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) n += cfg.is_moe_layer(l);
  return n;
}

}  // namespace

model::ModelShape expert_parallel_half(model::ModelShape shape, int ep, bool experts) {
  return half(std::move(shape), ep, experts);
}

void check_expert_parallel(const PlanRequest& r, int dp) {
  if (r.ep < 1) fail("--ep must be >= 1, got ", r.ep);
  if (r.ep == 1) return;
  if (r.params_override > 0) fail("--ep needs a model (--model or --config), not a bare parameter count");
  if (!r.model.is_moe())
    fail("--ep ", r.ep, ": model_type ", r.model.model_type, " is a dense model (no experts to split); drop --ep or "
         "plan a mixture-of-experts model");
  if (r.model.num_experts % r.ep != 0)
    fail("--ep ", r.ep, " does not divide the model's ", r.model.num_experts, " experts; choose a divisor of them");
  if (dp % r.ep != 0)
    fail("--ep ", r.ep, " does not divide the ", dp, " data-parallel ranks (expert-parallel ranks are carved out of "
         "them); choose a divisor of ", dp);
  if (r.shard > 0 && r.shard % r.ep != 0)
    fail("--ep ", r.ep, " with hybrid sharding: an expert-parallel group must lie inside one shard group of ", r.shard,
         " ranks; choose --shard a multiple of ", r.ep);
}

int64_t expert_elements(const model::LlamaConfig& cfg) {
  int64_t n = 0;
  for (const auto& [name, dims] : rank_shape(cfg, 1).params)
    if (expert_tensor(name)) {
      int64_t e = 1;
      for (auto d : dims) e *= d;
      n += e;
    }
  return n;
}

void expert_parallel_memory(const PlanRequest& r, int stage, int shards, MemoryBreakdown& m,
                            const model::ModelShape& rank) {
  // Each half's engine keeps its own host buffers (offload apart) and files; `m` holds the whole
  // rank's from the same formula, replaced here by the halves'.
  auto held = [&](const model::ModelShape& shape, int over) {
    return held_model_states(shape, stage, over, r.precision, r.grad_accum_dtype, r.persistence_threshold,
                             r.optimizer_state_precision, r.min_8bit_size, host_optimizer(r), masters_at(r, r.precision),
                             r.offload_optimizer_nvme_apart, param_offload(r));
  };
  const auto whole = held(rank, shards), dense = held(half(rank, r.ep, false), shards),
             experts = held(half(rank, r.ep, true), shards / r.ep);
  m.compute_params = dense.compute_params + experts.compute_params;
  m.gradients = dense.gradients + experts.gradients;
  m.master_params = dense.master_params + experts.master_params;
  m.optimizer_states = dense.optimizer_states + experts.optimizer_states;
  m.host += dense.host + experts.host - whole.host;
  m.offloaded += dense.offloaded + experts.offloaded - whole.offloaded;
}

void expert_parallel_comm(const PlanRequest& r, int shards, int64_t rank_parameters, StagePlan& sp) {
  const int stage = sp.stage;
  const double c = static_cast<double>(compute_bytes(r.precision));
  // The data-parallel collectives move only the replicated part now; the expert slices (X/ep
  // elements) move the same collectives over edp (the trainer's comm_edp_ metrics).
  const double x = static_cast<double>(expert_elements(r.model)) / r.ep;
  const double dense_share = 1.0 - x / static_cast<double>(rank_parameters);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    auto it = sp.comm_bytes.find(op);
    if (it != sp.comm_bytes.end()) it->second *= dense_share;
  }
  const int edp = shards / r.ep;
  const double psi = x * c;
  if (edp > 1) {
    if (stage == 0) sp.comm_bytes["edp_all_reduce"] = psi;
    if (stage >= 1) sp.comm_bytes["edp_reduce_scatter"] = psi * (stage >= 2 ? r.accumulation : 1);
    if (stage == 1 || stage == 2) sp.comm_bytes["edp_all_gather"] = psi / edp;
    if (stage == 3) sp.comm_bytes["edp_all_gather"] = 2 * psi / edp * r.accumulation;
  }
  // Per sparse layer and micro-batch: the counts (E int64), then the routed rows (tokens x top-k x
  // hidden) out and back, forward and backward (dropless: every assignment travels).
  const double rows = static_cast<double>(r.micro_batch * r.seq_len * r.model.num_experts_per_tok);
  const double per_layer = 8.0 * static_cast<double>(r.model.num_experts) + 4.0 * rows * r.model.hidden_size * c;
  sp.comm_bytes["ep_all_to_all"] = per_layer * static_cast<double>(sparse_layers(r.model) * r.accumulation);
}

}  // namespace shardlm::plan
