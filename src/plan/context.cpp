// Context parallelism in the plan (issue 43, parallel/context/): the keys and values each layer's
// attention keeps of the whole sequence, the exchange's bytes per step as the trainer counts them
// (comm::OpStats, each call's input; metrics comm_cp_*), and how the time model prices them.
#include <algorithm>

#include "plan/plan_internal.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

// KV rows of one rank: its tensor-parallel share of the KV heads (one head when tp exceeds them) x head_dim.
double kv_width(const PlanRequest& r) {
  return static_cast<double>(std::max<int64_t>(1, r.model.num_key_value_heads / r.tp) * r.model.head_dim());
}

// The attention core's forwards per micro-step: selective and full recomputation run it again in backward.
double core_forwards(const PlanRequest& r) { return r.recompute == "none" ? 1.0 : 2.0; }

}  // namespace

int64_t context_kv_bytes(const PlanRequest& r, int64_t layers, int64_t bytes) {
  if (r.cp <= 1) return 0;
  // Full recomputation keeps each layer's input only; the exchange is rebuilt one layer at a time.
  if (r.recompute == "full") return 0;
  const int64_t kv = static_cast<int64_t>(kv_width(r));
  // Ulysses keeps this rank's heads over the whole sequence where the others keep its positions of
  // every head: the same bytes as the activation estimate's q, k, v repeated to all heads.
  if (r.cp_mode == "all_to_all") return 0;
  // p2p: every block the ring brought (and this rank's own K/V stacked into the first message), the
  // whole sequence's K and V; all_gather: the gathered K and V of the whole sequence, and the mask of
  // this rank's queries against every key (bool, [T / cp, T] per micro-batch row).
  int64_t out = r.micro_batch * r.seq_len * 2 * kv * bytes * layers;
  if (r.cp_mode == "all_gather") out += r.micro_batch * rank_seq_len(r) * r.seq_len * layers;
  return out;
}

std::map<std::string, double> context_comm_bytes(const PlanRequest& r, int64_t layers) {
  std::map<std::string, double> out;
  if (r.cp <= 1) return out;
  const double c = static_cast<double>(compute_bytes(r.precision)), b = static_cast<double>(r.micro_batch);
  const double t = static_cast<double>(rank_seq_len(r)), kv = kv_width(r), cp = r.cp;
  const double per_step = static_cast<double>(r.accumulation) * static_cast<double>(layers);
  if (r.cp_mode == "p2p") {
    // cp - 1 hops of this rank's [2, B, KV, t, D] block forward (and again where the core is
    // recomputed), the same of its gradient backward.
    out["cp_p2p"] = per_step * (cp - 1) * 2 * b * kv * t * c * (core_forwards(r) + 1);
  } else if (r.cp_mode == "all_gather") {
    // Forward: K and V all-gathered (inputs of t positions); backward: their gradients
    // reduce-scattered (inputs of the whole sequence).
    out["cp_all_gather"] = per_step * 2 * b * kv * t * c * core_forwards(r);
    out["cp_reduce_scatter"] = per_step * 2 * b * kv * t * cp * c;
  } else {
    // Ulysses: q, k, v to the head split and the output back, forward; the same four backward.
    const int64_t heads = r.model.num_attention_heads / r.tp, kv_heads = std::max<int64_t>(1, r.model.num_key_value_heads / r.tp);
    const double q = static_cast<double>(heads * r.model.head_dim());
    const double kvw = kv_heads % r.cp == 0 ? kv : q;
    out["cp_all_to_all"] = per_step * (2 * q + 2 * kvw) * b * t * c * (core_forwards(r) + 1);
  }
  return out;
}

ContextCollective context_collective(const PlanRequest& r, const std::string& op, double layers) {
  const double per_step = static_cast<double>(r.accumulation) * layers;
  const double forwards = core_forwards(r);
  if (op == "cp_p2p") return {"p2p", 2, per_step * (r.cp - 1) * (forwards + 1)};
  if (op == "cp_all_gather") return {"all_gather", r.cp, per_step * 2 * forwards};
  if (op == "cp_reduce_scatter") return {"reduce_scatter", r.cp, per_step * 2};
  if (op == "cp_all_to_all") return {"all_to_all", r.cp, per_step * 4 * (forwards + 1)};
  fail("internal: no context-parallel collective named ", op);
}

std::vector<int> context_parallel_candidates(const PlanRequest& r, int dp, int tp) {
  std::vector<int> out{1};
  if (r.lora) return out;  // the planner prices LoRA without context parallelism (adapters.h)
  for (int cp = 2; cp <= dp; ++cp) {
    if (dp % cp != 0 || r.seq_len % (2 * cp) != 0) continue;
    if (r.cp_mode == "all_to_all" && (r.model.num_attention_heads / tp) % cp != 0) continue;
    out.push_back(cp);
  }
  return out;
}

}  // namespace shardlm::plan
