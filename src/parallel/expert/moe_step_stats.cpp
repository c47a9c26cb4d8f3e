// The reduction of a step's MoE statistics over the layout's groups (parallel/expert/moe_step_stats.h).
#include "parallel/expert/moe_step_stats.h"

#include <ATen/ATen.h>

#include <vector>

namespace shardlm::parallel {

std::map<std::string, double> moe_step_metrics(model::Llama& model, const ParallelDims& dims, bool sequence_parallel) {
  std::map<std::string, double> out;
  if (!model.config().is_moe()) return out;
  const bool aux = model.config().output_router_logits;
  const int64_t E = model.config().num_experts;
  auto counts = model.take_expert_tokens();
  if (counts.empty()) counts.assign(E + 1, 0);
  auto t = at::zeros({2 + E + 1}, at::kDouble);  // aux sum, forwards, E counts, dropped
  if (aux) {
    auto [sum, forwards] = model.take_router_aux_losses();
    t[1] = static_cast<double>(forwards);
    if (forwards > 0) t.narrow(0, 0, 1).add_(sum.cpu());
  }
  t.narrow(0, 2, E + 1).copy_(at::tensor(counts, at::kDouble));
  dims.dp_comm->all_reduce(t);
  dims.pp_comm->all_reduce(t);  // (one rank without pipelining)
  if (sequence_parallel) {
    auto c = t.narrow(0, 2, E + 1).clone();
    dims.tp_comm->all_reduce(c);
    t.narrow(0, 2, E + 1).copy_(c);
  }
  if (aux) out["router_aux_loss"] = t[0].item<double>() / t[1].item<double>();
  for (int64_t e = 0; e < E; ++e) out["moe_tokens_expert_" + std::to_string(e)] = t[2 + e].item<double>();
  out["moe_dropped_tokens"] = t[2 + E].item<double>();
  return out;
}

}  // namespace shardlm::parallel
