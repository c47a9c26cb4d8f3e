// Communication per step per rank, in message bytes as the trainer counts them (comm::OpStats: each
// call's input): data parallelism's all-reduce or ZeRO's reduce-scatter/all-gather of this rank's
// parameters, tensor parallelism's collectives (Megatron's layout as parallel/tensor runs it), and
// pipeline p2p; plus the buffers ZeRO's coalesced reduce-scatters hold, which are memory for comm.
#include <algorithm>

#include "plan/plan_internal.h"

namespace shardlm::plan {

// ZeRO's coalesced reduce-scatter buffers (zero_buckets.h): a send buffer of the largest bucket's
// elements and a receive buffer of this rank's 1/dp of it; a bucket holds at most the largest unit
// (the engine caps reduce_bucket_size there, and a larger unit is a bucket alone). One data-parallel
// rank reduces nothing and has no buckets.
int64_t bucket_buffer_bytes(const PlanRequest& r, int stage, int64_t largest_unit, int dp, int64_t bytes) {
  if (stage == 0 || dp <= 1 || r.reduce_bucket <= 0) return 0;
  const double bucket = std::min(r.reduce_bucket, static_cast<double>(largest_unit));
  return static_cast<int64_t>(bucket * (1.0 + 1.0 / dp)) * bytes;
}

std::map<std::string, double> tensor_parallel_comm_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t s,
                                                         int64_t accumulation, const std::string& precision,
                                                         const std::string& recompute, int t, bool sequence_parallel) {
  // Megatron-LM's collectives (Shoeybi et al. 2019; Korthikanti et al. 2022) as this trainer runs
  // them (parallel/tensor/tensor_parallel.cpp), per micro-step, with n = b*s*h elements of the
  // compute dtype (c bytes), L layers, bytes = each call's input (comm::OpStats):
  //   no SP: all-reduce of n, 2 per layer in forward (g after o_proj, down_proj) and 2 in backward
  //          (f before q/k/v, gate/up), 1 in forward after the vocab-parallel embedding and 1 in
  //          backward at the head's input:                        tp_all_reduce  (4L + 2) n c
  //   SP:    each of those becomes a reduce-scatter (input n) and an all-gather (input n/t), the
  //          same algorithmic volume 2(t-1)/t n:       tp_reduce_scatter (4L + 2) n c,
  //                                                    tp_all_gather     (4L + 2) n/t c;
  //          the norm weights' partial gradients summed in backward: tp_all_reduce += (2L + 1) h c
  //   both:  the vocab-parallel cross-entropy's 3 forward all-reduces of b*s fp32 values (max, sum
  //          of exp, target logit):                                  tp_all_reduce += 3 b s 4;
  //          full recomputation runs each layer's forward again in backward: + its 2 forward
  //          collectives (all-reduce of n; SP: reduce-scatter of n and all-gather of n/t);
  //          KV heads replicated on t/KV ranks (t > KV): the k_proj and v_proj gradients summed
  //          over those ranks:                                 tp_kv_all_reduce  2L D h c.
  // Times the accumulation steps. Left out: the gradient norm's one fp64 sum per step.
  std::map<std::string, double> out;
  if (t <= 1) return out;
  const double c = static_cast<double>(compute_bytes(precision)), h = static_cast<double>(cfg.hidden_size);
  const double L = static_cast<double>(cfg.num_hidden_layers), n = static_cast<double>(b) * s * h;
  const double m = static_cast<double>(accumulation);
  const double calls = 4 * L + 2 + (recompute == "full" ? 2 * L : 0);  // of n each (an all-reduce or an SP pair)
  const double loss = 3.0 * b * s * 4;
  if (sequence_parallel) {
    out["tp_reduce_scatter"] = m * calls * n * c;
    out["tp_all_gather"] = m * calls * n / t * c;
    out["tp_all_reduce"] = m * (loss + (2 * L + 1) * h * c);
  } else {
    out["tp_all_reduce"] = m * (calls * n * c + loss);
  }
  if (t > cfg.num_key_value_heads) out["tp_kv_all_reduce"] = m * 2 * L * cfg.head_dim() * h * c;
  return out;
}

void add_step_comm(const PlanRequest& r, int dp, int replicas, double psi_bytes, double shard_elements, StagePlan& sp) {
  const int stage = sp.stage;
  const bool bare = r.params_override > 0;
  const int64_t c = compute_bytes(r.precision);
  // Data parallelism moves this rank's parameters (its tensor-parallel shards), `psi_bytes`; with
  // hybrid sharding within the shard group (the trainer's comm_shard_ metrics), plus each shard's
  // gradient all-reduced across the groups once per step (comm_replica_all_reduce: stage 1 in the
  // compute dtype, stages 2-3 the persistent shard in grad_accum_dtype).
  const std::string group = replicas > 1 ? "shard_" : "";
  if (dp > 1) {
    if (stage == 0) sp.comm_bytes["all_reduce"] = psi_bytes;
    if (stage >= 1) sp.comm_bytes[group + "reduce_scatter"] = psi_bytes * (stage >= 2 ? r.accumulation : 1);
    if (stage <= 2 && stage >= 1) sp.comm_bytes[group + "all_gather"] = psi_bytes / dp;
    if (stage == 3) sp.comm_bytes[group + "all_gather"] = 2 * psi_bytes / dp * r.accumulation;
    sp.comm_model_multiple = stage == 3 ? 3.0 * r.accumulation : stage == 2 ? 1.0 * r.accumulation + 1 : 2.0;
  }
  if (replicas > 1 && stage >= 1) {
    const int64_t g = stage == 1 ? c : r.grad_accum_dtype == "bf16" ? 2 : 4;
    sp.comm_bytes["replica_all_reduce"] = shard_elements * static_cast<double>(g);
  }
  if (!bare && r.tp > 1) {
    // The busiest pipeline stage (an approximation): ceil(L/pp) layers, the embedding and the head.
    auto stage_model = r.model;
    stage_model.num_hidden_layers = (r.model.num_hidden_layers + r.pp - 1) / r.pp;
    for (const auto& [op, bytes] : tensor_parallel_comm_bytes(stage_model, r.micro_batch, r.seq_len, r.accumulation,
                                                              r.precision, r.recompute, r.tp, r.sequence_parallel))
      sp.comm_bytes[op] = bytes;
  }
  if (!bare) {  // context parallelism's K/V exchange (context.cpp), on the busiest stage's layers
    const int64_t layers = (r.model.num_hidden_layers + r.pp - 1) / r.pp;
    for (const auto& [op, bytes] : context_comm_bytes(r, layers)) sp.comm_bytes[op] = bytes;
  }
  if (r.pp > 1) sp.comm_bytes["p2p"] = 2.0 * r.micro_batch * r.seq_len * r.model.hidden_size * c * r.accumulation;
}

}  // namespace shardlm::plan
