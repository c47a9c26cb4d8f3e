// Activation bytes of one micro-step on one rank: what forward leaves for backward (per decoder
// layer, the head, the residual stream), what activation checkpointing rebuilds at a time, and
// backward's temporaries beyond them (measured against the trainer's peak RSS); with Korthikanti et
// al. 2022's textbook formula alongside. Pipeline stages reuse the per-part figures (pipeline.cpp).
#include <algorithm>
#include <cmath>

#include "plan/plan_internal.h"

namespace shardlm::plan {

// Korthikanti et al. 2022, GPT layer with 16-bit activations and no recomputation: s*b*h*(34 +
// 5*a*s/h) bytes per layer; under tensor parallelism sbh(10 + 24/t + 5as/(ht)) (the 10 sbh of
// layer norms, dropout masks and residual inputs replicated), all of it / t with sequence parallelism.
double korthikanti_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t s, int tp, int pp, bool sequence_parallel) {
  const double h = cfg.hidden_size, a = cfg.num_attention_heads;
  const double layers = std::ceil(double(cfg.num_hidden_layers) / pp);
  const double per_layer = sequence_parallel ? (34 + 5 * a * s / h) / tp : 10 + (24 + 5 * a * s / h) / tp;
  return layers * s * b * h * per_layer;
}

namespace {

// Bytes one token leaves for backward in one layer's MLP, on this rank. Dense: gate, SiLU, up and
// their product, 4 x intermediate, split over tp. Sparse (model/moe.cpp, measured on the MoE demo:
// 12.8 KB per routed copy of a token against 12.8 KB predicted, 50.3 MB per 512 more expert columns
// against 50.3 MB): each of the top-k copies keeps its gathered row, the expert's 4 x expert width,
// the expert's output and its weighted copy (index_add keeps its source): 3 hidden + 4 expert width
// in the compute dtype, plus its index and weight (24 bytes); the router keeps its fp32 softmax
// (and, with output_router_logits, the logits and the aux loss's softmax); the shared expert keeps
// 4 x its width, its output and its gate. A GShard capacity factor below 1 keeps at most that share
// of the copies. Experts are not split by tp: every tp rank routes the tokens it holds, all of them
// without sequence parallelism, its 1/tp of the positions with it. Expert parallelism moves copies
// between ranks; balanced routing leaves each rank k copies per token, the figure used.
// A model with dense and sparse layers: `mean` over its layers for what every layer holds, `most`
// for the one layer full recomputation rebuilds at a time.
struct MlpKept {
  int64_t mean, most;
};
MlpKept mlp_kept_per_token(const model::LlamaConfig& cfg, int64_t c, int tp, bool sequence_parallel) {
  const int64_t dense = 4 * cfg.intermediate_size * c / tp;
  if (!cfg.is_moe()) return {dense, dense};
  const int64_t h = cfg.hidden_size, E = cfg.num_experts, acc = c == 8 ? 8 : 4;
  const double copies = static_cast<double>(cfg.num_experts_per_tok) *
                        (cfg.moe_capacity_factor > 0 ? std::min(1.0, cfg.moe_capacity_factor) : 1.0);
  double sparse = copies * static_cast<double>((3 * h + 4 * cfg.expert_intermediate_size()) * c + 24) +
                  static_cast<double>(E * acc) + (cfg.output_router_logits ? static_cast<double>(E * (c + acc)) : 0.0);
  if (cfg.shared_expert_intermediate_size > 0) sparse += static_cast<double>((4 * cfg.shared_expert_intermediate_size + h + 1) * c);
  const auto per_rank = static_cast<int64_t>(sparse) / (sequence_parallel ? tp : 1);
  int64_t sum = 0, most = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const int64_t kept = cfg.is_moe_layer(l) ? per_rank : dense;
    sum += kept;
    most = std::max(most, kept);
  }
  return {sum / std::max<int64_t>(1, cfg.num_hidden_layers), most};
}

}  // namespace

ActivationParts activation_parts(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                                 const std::string& recompute, int tp, bool fused_attention, bool sequence_parallel) {
  // What this implementation keeps for backward (the ops of model/llama.cpp), per token:
  //  - each RMSNorm: its input upcast to fp32, the normalised value and the weighted output
  //    (3 x hidden in fp32 models; 4 + 2 + 2 bytes per element in 16-bit ones);
  //  - attention: rotated q, k and v repeated to all heads, the attention output (4 x heads x
  //    head_dim, which is 4 x hidden unless config.json's head_dim says otherwise),
  //    and, on the eager path, the probabilities, heads x T per token, in fp32 (plus their 16-bit
  //    copy); a fused kernel keeps only the softmax's log-sum-exp, one fp32 value per head;
  //  - MLP: gate, SiLU, up and their product (4 x intermediate; mixture of experts: mlp_kept_per_token);
  //  - head: the final norm and the fp32 log-probabilities (vocab).
  // 16-bit products computed in fp32 on CPU (model/fp32_products.h) keep only their 16-bit inputs.
  // Recomputation (model/recompute.h): "selective" keeps the attention core's inputs q, k, v (k and
  // v not yet repeated to all heads) instead of its internals, and rebuilds one layer's core at a
  // time in backward; "full" keeps each layer's input and rebuilds one whole layer at a time.
  // Tensor parallelism splits the parallel regions (attention heads, MLP columns, vocabulary) over
  // tp; the residual stream and the norms are replicated, unless sequence parallelism splits them
  // along the sequence. Even then the column products keep their all-gathered full input (the
  // gather's output; Megatron keeps the shard and gathers again in backward), c x hidden per norm.
  const int64_t c = compute_bytes(precision), h = cfg.hidden_size, a = cfg.num_attention_heads,
                V = cfg.vocab_size;
  // KV rows this rank holds: its share of the KV heads, or one head when tp exceeds them.
  const int64_t kv = std::max<int64_t>(1, cfg.num_key_value_heads / tp) * cfg.head_dim();
  const int64_t q = cfg.num_attention_heads * cfg.head_dim();  // width of q and of the attention output
  const int64_t tokens = b * T;
  const int64_t norm = h * (c < 4 ? 4 + 2 * c : 3 * c);
  // One norm and the products' input it feeds, for all tokens.
  const int64_t norm_kept = sequence_parallel ? tokens * (norm - h * c) / tp + tokens * h * c : tokens * norm;
  const int64_t residual = sequence_parallel ? tokens * h * c / tp : tokens * h * c;  // a layer's input
  const int64_t attention = fused_attention ? a * 4 : a * T * (4 + (c < 4 ? c : 0));
  const auto mlp = mlp_kept_per_token(cfg, c, tp, sequence_parallel);
  const int64_t layer_core = 2 * norm_kept + tokens * (4 * q * c + attention) / tp;
  const int64_t layer_full = layer_core + tokens * mlp.mean;
  const int64_t head = norm_kept + tokens * 4 * V / tp;
  if (recompute == "full") return {residual, head, residual, layer_core + tokens * mlp.most};
  if (recompute == "selective") {
    const int64_t kept = 2 * norm_kept + tokens * 2 * q * c / tp + tokens * mlp.mean + tokens * 2 * kv * c;
    return {kept, head, residual, tokens * (attention + 2 * q * c) / tp};
  }
  return {layer_full, head, residual, 0};
}

ActivationEstimate estimate_activations(const model::LlamaConfig& cfg, int64_t b, int64_t T,
                                        const std::string& precision, const std::string& recompute, int tp, int pp,
                                        bool fused_attention, bool sequence_parallel) {
  // See activation_parts; pp > 1: the ceil(L/pp) layers of the busiest stage and the head.
  const auto a = activation_parts(cfg, b, T, precision, recompute, tp, fused_attention, sequence_parallel);
  const int64_t layers = (cfg.num_hidden_layers + pp - 1) / pp;
  return {layers * a.layer + a.head, a.recompute_peak};
}

int64_t backward_peak_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                            int tp, int64_t layers, bool head, bool embedding, bool products_in_fp32,
                            bool fused_attention) {
  // Measured on the demo model (fp32 and bf16 with fp32 products, ZeRO 0-3, 1-2 ranks, 2-12 layers,
  // vocabularies 4096 and 8192, 512-1024 tokens): peak-RSS growth over forward + backward minus the
  // bytes held after forward is, within ~6%, per micro-batch of N tokens:
  //  - the loss (fp32): nll_loss's gradient of the log-probabilities and log_softmax's gradient of the
  //    logits are alive together before the head's product: 2 N V 4; in 16-bit also the logits'
  //    gradient rounded to 16-bit and, with fp32 products, its fp32 copy for the product: N V (c + 4);
  //  - the head's (or the embedding's) weight gradient V h, computed before it is added into the
  //    gradient buffer (with fp32 products: fp32, then rounded);
  //  - per decoder layer N (2f + 2h) values (in 16-bit with fp32 products an fp32 and a 16-bit copy of
  //    each; measured on the CPU heap only: on a GPU the caching allocator may reuse them, unmeasured) that
  //    backward allocates beyond what it frees: the MLP's gate/up and attention/residual gradients,
  //    which glibc (kept from trimming, cli/launch.h) places above the holes of the freed activations.
  //    With glibc's defaults 2f per layer remains (the gradient blocks themselves).
  //  - eager attention: the probabilities' and scores' gradients of one layer, 2 N heads T fp32.
  // Vocabulary, MLP width and heads are split over tp; the residual width is not.
  const double c = static_cast<double>(compute_bytes(precision)), h = static_cast<double>(cfg.hidden_size);
  // Mixture of experts: the MLP's gradient blocks are those of the k routed copies and the shared
  // expert, per token (not split by tp, see mlp_kept_per_token).
  const double moe_f = static_cast<double>(cfg.num_experts_per_tok * cfg.expert_intermediate_size() +
                                           cfg.shared_expert_intermediate_size);
  const double V = static_cast<double>(cfg.vocab_size) / tp,
               f = cfg.is_moe() ? std::max(moe_f, static_cast<double>(cfg.intermediate_size) / tp)
                                : static_cast<double>(cfg.intermediate_size) / tp;
  const double N = static_cast<double>(b) * T, a = static_cast<double>(cfg.num_attention_heads) / tp;
  const double wide = c < 4 && products_in_fp32 ? 4 + c : c;  // a product's temporaries
  double bytes = layers * N * (2 * f + 2 * h) * wide;
  if (head) bytes += 2 * N * V * 4 + (c < 4 ? N * V * wide : 0);
  if (head || embedding) bytes += V * h * wide;
  if (!fused_attention && layers > 0) bytes += 2 * N * a * T * 4;
  return static_cast<int64_t>(bytes);
}

int64_t activation_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                         const std::string& recompute, int tp, int pp, bool fused_attention, bool sequence_parallel) {
  const auto e = estimate_activations(cfg, b, T, precision, recompute, tp, pp, fused_attention, sequence_parallel);
  return e.held + e.recompute_peak;
}

std::string activation_method(const PlanRequest& r) {
  const bool bare = r.params_override > 0;
  return
      bare ? "not estimated (parameter count only)"
           : std::string("tensors this implementation saves for backward, per layer ~(10h + 4f) x tokens in the "
                         "compute dtype" +
                             std::string(r.fused_attention ? " (fused attention: no T^2 term)"
                                                           : " + heads x T^2 attention probabilities in fp32 (eager attention)")) +
                 (r.recompute == "full" ? "; full recomputation keeps each layer's input and rebuilds one layer" : "") +
                 (r.recompute == "selective" ? "; selective recomputation keeps q, k, v and rebuilds the attention core" : "") +
                 (r.tp > 1 ? (r.sequence_parallel ? "; tp splits attention and MLP by heads/columns and the norms and "
                                                    "residual stream by sequence (sequence parallel)"
                                                  : "; tp splits attention and MLP by heads/columns, the norms and "
                                                    "residual stream are replicated")
                           : "") +
                 " (Korthikanti et al. 2022's GPT formula sbh(34 + 5as/h) shown alongside)";
}

}  // namespace shardlm::plan
