// The strategy recommendation: the decision tree users know (fits: data parallelism; short by up to
// 2x: ZeRO-2, with recomputation only when it does not fit without; up to 8x: ZeRO-3 likewise;
// beyond: tensor parallelism within a node and pipeline parallelism across nodes), one line of
// reason per decision, from the same memory figures the plan prints. It starts from the requested
// layout and changes only what a decision names. With a machine profile, `plan --search` ranks every
// fitting layout by predicted time instead (search.h).
#include <algorithm>
#include <cstdio>

#include "parallel/tensor/tp_layout.h"
#include "plan/plan_internal.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

// Bytes per rank that must fit at ZeRO stage `stage` with `recompute` and `precision` (pp > 1: the
// largest pipeline stage's, without its comm buffers and gathered working set).
int64_t total_for(const Plan& p, int stage, const std::string& recompute, const std::string& precision) {
  const auto& r = p.request;
  const bool bare = r.params_override > 0;
  const bool pipeline = !bare && r.pp > 1;
  const int slice = bare ? r.tp * r.pp : 1;
  if (bare) return bare_model_states(p.parameters, stage, p.dp, precision).total();
  if (pipeline) {
    int64_t peak = 0;
    for (const auto& ps : p.pipeline_stages) {
      const auto m = pipeline_stage_memory(r, p.dp, ps, stage, precision, recompute);
      peak = std::max(peak, m.model_states() + m.activations + m.recompute_peak + m.backward_peak);
    }
    return peak;
  }
  auto m = model_state_bytes(r.model, stage, p.dp, precision, r.grad_accum_dtype, r.persistence_threshold, r.tp,
                             r.optimizer_state_precision, r.min_8bit_size, false, masters_at(r, precision));
  return m.total() / slice + activation_bytes(r.model, r.micro_batch, rank_seq_len(r), precision, recompute, r.tp, r.pp,
                                             r.fused_attention, r.sequence_parallel) +
         backward_peak_bytes(r.model, r.micro_batch, rank_seq_len(r), precision, r.tp, r.model.num_hidden_layers, true,
                             true, r.products_in_fp32, r.fused_attention);
}

}  // namespace

void recommend(Plan& p) {
  const auto& r = p.request;
  const bool bare = r.params_override > 0;
  // Without a reason to change it, the recommendation is the requested layout.
  p.recommended_stage = std::max(0, r.zero_stage);
  p.recommended_tp = r.tp;
  p.recommended_pp = r.pp;
  p.recommended_sequence_parallel = r.sequence_parallel;
  p.recommended_recompute = r.recompute;
  if (r.device_memory <= 0) {
    p.reasons.push_back("no --device-memory given: showing the numbers without a recommendation");
    return;
  }
  const double need = static_cast<double>(total_for(p, 0, "none", r.precision));
  const double ratio = need / r.device_memory;
  char line[256];
  std::snprintf(line, sizeof line, "data parallel needs %s per rank, %.2fx the %s device", gb(need).c_str(), ratio,
                gb(r.device_memory).c_str());
  p.reasons.push_back(line);
  if (ratio <= 1) {
    p.recommended_stage = 0;
    p.reasons.push_back("it fits one device: plain data parallelism (stage 0), no sharding overhead");
  } else if (ratio <= 2 && total_for(p, 2, "none", "bf16") <= r.device_memory) {
    p.recommended_stage = 2;
    p.recommended_recompute = "none";
    p.reasons.push_back("short by up to 2x: ZeRO-2 shards gradients and optimizer states and bf16 halves weights and "
                        "activations; that fits without recomputation, which would cost a third more compute");
  } else if (ratio <= 2 && total_for(p, 2, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 2;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by up to 2x: ZeRO-2 shards gradients and optimizer states, bf16 halves weights and "
                        "activations, recomputation keeps one layer's activations");
  } else if (ratio <= 8 && total_for(p, 3, "none", "bf16") <= r.device_memory) {
    p.recommended_stage = 3;
    p.recommended_recompute = "none";
    p.reasons.push_back("short by 2-8x: ZeRO-3 also shards the parameters (1.5x the communication of stage 2); that "
                        "fits without recomputation");
  } else if (ratio <= 8 && total_for(p, 3, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 3;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by 2-8x: ZeRO-3 also shards the parameters (1.5x the communication of stage 2)");
  } else if (!bare && r.model.is_moe()) {
    // Tensor parallelism splits only attention and replicates the experts (tp_layout.h), which hold
    // most of a sparse model's parameters: ZeRO-3 (with recomputation where needed) is the sharding
    // recommended, however short stage 0 is; pipeline stages and expert parallelism are the user's
    // choice (plan --pp, --ep).
    p.recommended_stage = 3;
    const bool plain = total_for(p, 3, "none", "bf16") <= r.device_memory;
    p.recommended_recompute = plain ? "none" : "full";
    if (plain || total_for(p, 3, "full", "bf16") <= r.device_memory)
      p.reasons.push_back(std::string("a mixture-of-experts model: tensor parallelism would replicate its experts (it "
                                      "splits attention only); ZeRO-3 shards every parameter") +
                          (plain ? "; that fits without recomputation" : ", with full recomputation"));
    else
      p.reasons.push_back("a mixture-of-experts model: tensor parallelism would replicate its experts (it splits "
                          "attention only), and even ZeRO-3 with full recomputation does not fit; use more devices, "
                          "pipeline stages (--pp), expert parallelism (--ep) or devices with more memory");
  } else {
    p.recommended_stage = 1;
    p.recommended_recompute = "full";
    // The largest tensor-parallel size up to a node (8) that divides the devices and that the
    // model's heads, MLP width and vocabulary allow.
    p.recommended_tp = 1;
    for (int t = std::min(8, r.devices); t > 1 && p.recommended_tp == 1; --t) {
      if (r.devices % t != 0) continue;
      if (bare) {
        p.recommended_tp = t;
        continue;
      }
      try {
        parallel::tp::check_tensor_parallel(r.model, t, false, r.seq_len);
        p.recommended_tp = t;
      } catch (const Error&) {
      }
    }
    p.recommended_pp = std::max(1, r.devices / 8 >= 2 ? std::min(r.devices / 8, 8) : 1);  // (MoE: the branch above)
    while (r.devices % (p.recommended_tp * p.recommended_pp) != 0) --p.recommended_pp;
    // Sequence parallelism splits the replicated norms and residual stream too, for the same traffic.
    p.recommended_sequence_parallel = p.recommended_tp > 1 && r.seq_len % p.recommended_tp == 0;
    p.reasons.push_back("beyond what sharding data-parallel state can save: tensor parallelism within a node (tp=" +
                        std::to_string(p.recommended_tp) + ") splits every layer" +
                        (p.recommended_sequence_parallel ? " (sequence parallel: norms and residual stream too, same "
                                                           "communication volume)"
                                                         : "") +
                        ", pipeline parallelism across nodes (pp=" + std::to_string(p.recommended_pp) +
                        ") splits the layer stack, data parallelism outside");
  }
}

}  // namespace shardlm::plan
