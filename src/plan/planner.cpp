#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/llama.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/tensor/tp_layout.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/stage3_schedule.h"
#include "parallel/zero/zero_memory.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::plan {
namespace {

int64_t compute_bytes(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

std::string gb(double bytes) { return util::format_bytes(bytes); }

// Korthikanti et al. 2022, GPT layer with 16-bit activations and no recomputation: s*b*h*(34 +
// 5*a*s/h) bytes per layer; under tensor parallelism sbh(10 + 24/t + 5as/(ht)) (the 10 sbh of
// layer norms, dropout masks and residual inputs replicated), all of it / t with sequence parallelism.
double korthikanti_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t s, int tp, int pp, bool sequence_parallel) {
  const double h = cfg.hidden_size, a = cfg.num_attention_heads;
  const double layers = std::ceil(double(cfg.num_hidden_layers) / pp);
  const double per_layer = sequence_parallel ? (34 + 5 * a * s / h) / tp : 10 + (24 + 5 * a * s / h) / tp;
  return layers * s * b * h * per_layer;
}

// The parameters one tensor-parallel rank holds (tp = 1: the whole model), and their flat units:
// what the trainer packs after tensor parallelism has replaced the weights by their shards.
model::ModelShape rank_shape(const model::LlamaConfig& cfg, int tp) {
  if (tp > 1) parallel::tp::check_tensor_parallel(cfg, tp, false, 0);
  return parallel::tp::sharded_shape(model::describe(cfg), cfg, tp);
}
parallel::FlatLayout rank_layout(const model::LlamaConfig& cfg, int tp, int dp) {
  return parallel::FlatLayout::build(rank_shape(cfg, tp), dp);
}

// Model states per rank when the model is given only as a parameter count: the ZeRO paper's
// arithmetic without padding (mixed precision: 2 + 2 + 12 bytes per parameter).
MemoryBreakdown bare_model_states(int64_t psi, int stage, int dp, const std::string& precision) {
  const int64_t c = compute_bytes(precision), master = c < 4 ? 4 : 0;
  MemoryBreakdown m;
  m.compute_params = stage == 3 ? c * psi / dp : c * psi;
  m.gradients = stage >= 2 ? c * psi / dp : c * psi;
  m.master_params = stage >= 1 ? master * psi / dp : master * psi;
  m.optimizer_states = stage >= 1 ? 8 * psi / dp : 8 * psi;
  return m;
}

}  // namespace

double parse_bytes(const std::string& text) { return util::parse_bytes(text); }

namespace {
// Model-state bytes of what one rank holds (`shape`) by the engine's own formula
// (parallel/zero/zero_memory.h); stage 0 keeps whole units on every rank.
MemoryBreakdown held_model_states(const model::ModelShape& shape, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold) {
  const auto layout = parallel::FlatLayout::build(shape, stage == 0 ? 1 : dp);
  const int64_t c = compute_bytes(precision), g = grad_accum_dtype == "bf16" ? 2 : 4;
  const auto z = parallel::zero_state_bytes(layout, stage, {c, g, 4}, persistence_threshold);
  MemoryBreakdown m;
  m.compute_params = z.compute_params;
  m.gradients = z.gradients;
  m.master_params = z.master_params;
  m.optimizer_states = z.optimizer_states;
  return m;
}
}  // namespace

MemoryBreakdown model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold, int tp) {
  return held_model_states(rank_shape(cfg, tp), stage, dp, precision, grad_accum_dtype, persistence_threshold);
}

namespace {

// One micro-batch's activations, by part: a decoder layer's, the head's, one residual-stream tensor
// (a pipeline stage's output or input), and what recomputation rebuilds at a time.
struct ActivationParts {
  int64_t layer = 0, head = 0, residual = 0, recompute_peak = 0;
};

ActivationParts activation_parts(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                                 const std::string& recompute, int tp, bool fused_attention, bool sequence_parallel) {
  // What this implementation keeps for backward (the ops of model/llama.cpp), per token:
  //  - each RMSNorm: its input upcast to fp32, the normalised value and the weighted output
  //    (3 x hidden in fp32 models; 4 + 2 + 2 bytes per element in 16-bit ones);
  //  - attention: rotated q, k and v repeated to all heads, the attention output (4 x heads x
  //    head_dim, which is 4 x hidden unless config.json's head_dim says otherwise),
  //    and, on the eager path, the probabilities, heads x T per token, in fp32 (plus their 16-bit
  //    copy); a fused kernel keeps only the softmax's log-sum-exp, one fp32 value per head;
  //  - MLP: gate, SiLU, up and their product (4 x intermediate);
  //  - head: the final norm and the fp32 log-probabilities (vocab).
  // 16-bit products computed in fp32 on CPU (model/fp32_products.h) keep only their 16-bit inputs.
  // Recomputation (model/recompute.h): "selective" keeps the attention core's inputs q, k, v (k and
  // v not yet repeated to all heads) instead of its internals, and rebuilds one layer's core at a
  // time in backward; "full" keeps each layer's input and rebuilds one whole layer at a time.
  // Tensor parallelism splits the parallel regions (attention heads, MLP columns, vocabulary) over
  // tp; the residual stream and the norms are replicated, unless sequence parallelism splits them
  // along the sequence. Even then the column products keep their all-gathered full input (the
  // gather's output; Megatron keeps the shard and gathers again in backward), c x hidden per norm.
  const int64_t c = compute_bytes(precision), h = cfg.hidden_size, f = cfg.intermediate_size,
                a = cfg.num_attention_heads, V = cfg.vocab_size;
  // KV rows this rank holds: its share of the KV heads, or one head when tp exceeds them.
  const int64_t kv = std::max<int64_t>(1, cfg.num_key_value_heads / tp) * cfg.head_dim();
  const int64_t q = cfg.num_attention_heads * cfg.head_dim();  // width of q and of the attention output
  const int64_t tokens = b * T;
  const int64_t norm = h * (c < 4 ? 4 + 2 * c : 3 * c);
  // One norm and the products' input it feeds, for all tokens.
  const int64_t norm_kept = sequence_parallel ? tokens * (norm - h * c) / tp + tokens * h * c : tokens * norm;
  const int64_t residual = sequence_parallel ? tokens * h * c / tp : tokens * h * c;  // a layer's input
  const int64_t attention = fused_attention ? a * 4 : a * T * (4 + (c < 4 ? c : 0));
  const int64_t layer_full = 2 * norm_kept + tokens * (4 * q * c + 4 * f * c + attention) / tp;
  const int64_t head = norm_kept + tokens * 4 * V / tp;
  if (recompute == "full") return {residual, head, residual, layer_full};
  if (recompute == "selective") {
    const int64_t kept = 2 * norm_kept + tokens * (2 * q + 4 * f) * c / tp + tokens * 2 * kv * c;
    return {kept, head, residual, tokens * (attention + 2 * q * c) / tp};
  }
  return {layer_full, head, residual, 0};
}

// ZeRO's coalesced reduce-scatter buffers (zero_buckets.h): a send buffer of the largest bucket's
// elements and a receive buffer of this rank's 1/dp of it; a bucket holds at most the largest unit
// (the engine caps reduce_bucket_size there, and a larger unit is a bucket alone). One data-parallel
// rank reduces nothing and has no buckets.
int64_t bucket_buffer_bytes(const PlanRequest& r, int stage, int64_t largest_unit, int dp, int64_t bytes) {
  if (stage == 0 || dp <= 1 || r.reduce_bucket <= 0) return 0;
  const double bucket = std::min(r.reduce_bucket, static_cast<double>(largest_unit));
  return static_cast<int64_t>(bucket * (1.0 + 1.0 / dp)) * bytes;
}

}  // namespace

namespace {

// The decoder-layer counts of the trainer's split (compute-balanced, or parallelism.pipeline_split).
std::vector<int64_t> stage_layer_counts(const model::LlamaConfig& cfg, int pp, const std::vector<int64_t>& split) {
  return parallel::pp::layer_counts(cfg, pp, split);
}

// The parameters one rank of pipeline stage `s` holds, as the trainer leaves them
// (parallel/pipeline/placement.cpp): its units' tensor-parallel shards, every other parameter
// emptied to {0}; on the last stage, with tied embeddings, also its own copy of the embedding.
model::ModelShape stage_shape(const model::LlamaConfig& cfg, int tp, int pp, int s, const std::vector<int64_t>& split) {
  if (tp > 1) parallel::tp::check_tensor_parallel(cfg, tp, false, 0);
  auto shape = parallel::tp::sharded_shape(model::describe(cfg), cfg, tp);
  const auto units = parallel::pp::stage_units(stage_layer_counts(cfg, pp, split), s);
  std::vector<bool> held(shape.params.size(), false);
  for (size_t u = units.first; u <= units.last; ++u)
    for (size_t i : shape.units[u].params) held[i] = true;
  if (cfg.tie_word_embeddings && pp > 1 && s == pp - 1) held[0] = true;
  for (size_t i = 0; i < shape.params.size(); ++i)
    if (!held[i]) shape.params[i].second = {0};
  return shape;
}

}  // namespace

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
  const double V = static_cast<double>(cfg.vocab_size) / tp, f = static_cast<double>(cfg.intermediate_size) / tp;
  const double N = static_cast<double>(b) * T, a = static_cast<double>(cfg.num_attention_heads) / tp;
  const double wide = c < 4 && products_in_fp32 ? 4 + c : c;  // a product's temporaries
  double bytes = layers * N * (2 * f + 2 * h) * wide;
  if (head) bytes += 2 * N * V * 4 + (c < 4 ? N * V * wide : 0);
  if (head || embedding) bytes += V * h * wide;
  if (!fused_attention && layers > 0) bytes += 2 * N * a * T * 4;
  return static_cast<int64_t>(bytes);
}

int64_t pipeline_micro_batches_alive(const std::string& schedule, int pp, int stage, int64_t m) {
  // 1F1B (schedule.cpp): min(p - s - 1, m) warm-up forwards, then one more forward before each
  // backward: min(p - s, m) micro-batches alive at the peak. GPipe runs every forward first.
  if (schedule == "gpipe") return m;
  return std::min<int64_t>(pp - stage, m);
}

MemoryBreakdown pipeline_model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp,
                                           const std::string& precision, const std::string& grad_accum_dtype,
                                           double persistence_threshold, int tp, int pp, int pipeline_stage,
                                           const std::vector<int64_t>& split) {
  return held_model_states(stage_shape(cfg, tp, pp, pipeline_stage, split), stage, dp, precision, grad_accum_dtype,
                           persistence_threshold);
}

ActivationEstimate estimate_pipeline_stage_activations(const model::LlamaConfig& cfg, int64_t b, int64_t T,
                                                       const std::string& precision, const std::string& recompute,
                                                       int tp, int pp, int s, int64_t alive, bool fused_attention,
                                                       bool sequence_parallel, const std::vector<int64_t>& split) {
  // Per micro-batch in flight (schedule.cpp keeps each one's input and output until its backward):
  // the stage's layers; the head on the last stage; the output sent on (a residual-stream tensor
  // no op of this stage saves; on stage 0 the embedding's path ends there); the received input in
  // 16-bit (in fp32 it is the tensor the first norm saves, already counted).
  const auto a = activation_parts(cfg, b, T, precision, recompute, tp, fused_attention, sequence_parallel);
  const auto counts = stage_layer_counts(cfg, pp, split);
  int64_t per = counts[s] * a.layer;
  if (s == pp - 1) per += a.head;
  if (s < pp - 1) per += a.residual;
  if (s > 0 && compute_bytes(precision) < 4) per += a.residual;
  return {alive * per, a.recompute_peak};
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

int64_t activation_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                         const std::string& recompute, int tp, int pp, bool fused_attention, bool sequence_parallel) {
  const auto e = estimate_activations(cfg, b, T, precision, recompute, tp, pp, fused_attention, sequence_parallel);
  return e.held + e.recompute_peak;
}

Plan make_plan(const PlanRequest& r) {
  if (r.devices < 1) fail("--devices must be >= 1");
  if (r.tp < 1 || r.pp < 1 || r.devices % (r.tp * r.pp) != 0)
    fail("devices ", r.devices, " must be a multiple of tp x pp = ", r.tp * r.pp);
  if (r.precision != "bf16" && r.precision != "fp16" && r.precision != "fp32")
    fail("--precision must be bf16, fp16 or fp32, got '", r.precision, "'");
  if (r.recompute != "none" && r.recompute != "full" && r.recompute != "selective")
    fail("--recompute must be none, full or selective, got '", r.recompute, "'");
  if (r.params_override == 0 && r.seq_len > r.model.max_position_embeddings)
    fail("--seq-len ", r.seq_len, " exceeds the model's max_position_embeddings ", r.model.max_position_embeddings);
  if (r.params_override == 0) parallel::tp::check_tensor_parallel(r.model, r.tp, r.sequence_parallel, r.seq_len);
  else if (r.sequence_parallel && r.tp == 1) fail("sequence parallelism needs tensor parallelism (--tp > 1)");
  if (r.pipeline_schedule != "1f1b" && r.pipeline_schedule != "gpipe")
    fail("--schedule must be 1f1b or gpipe, got '", r.pipeline_schedule, "'");
  Plan p;
  p.request = r;
  p.dp = r.devices / (r.tp * r.pp);
  const bool bare = r.params_override > 0;
  p.parameters = bare ? r.params_override : r.model.num_parameters();
  const int64_t c = compute_bytes(r.precision);
  // The parameters one tensor-parallel rank holds. Pipeline stages hold their own units' parameters
  // (below); for a bare parameter count, pp and tp split them evenly.
  const auto layout = bare ? parallel::FlatLayout{} : rank_layout(r.model, r.tp, p.dp);
  p.rank_parameters = bare ? p.parameters / r.tp : layout.numel();
  const bool pipeline = !bare && r.pp > 1;
  const int slice = bare ? r.tp * r.pp : 1;
  // Pipeline stages: each one's units and parameters, and one rank's memory of it at a ZeRO stage.
  int64_t pipeline_largest_params = 0;
  if (pipeline) {
    const auto counts = parallel::pp::layer_counts(r.model, r.pp, r.pipeline_split);
    for (int s = 0; s < r.pp; ++s) {
      PipelineStagePlan ps;
      ps.stage = s;
      const auto units = parallel::pp::stage_units(counts, s);
      ps.first_unit = units.first;
      ps.last_unit = units.last;
      ps.layers = counts[s];
      ps.embedding_copy = r.model.tie_word_embeddings && s == r.pp - 1;
      ps.parameters = parallel::FlatLayout::build(stage_shape(r.model, r.tp, r.pp, s, r.pipeline_split), 1).numel();
      ps.micro_batches_alive = pipeline_micro_batches_alive(r.pipeline_schedule, r.pp, s, r.accumulation);
      pipeline_largest_params = std::max(pipeline_largest_params, ps.parameters);
      p.pipeline_stages.push_back(ps);
    }
  }
  auto pipeline_memory = [&](const PipelineStagePlan& ps, int stage, const std::string& precision,
                             const std::string& recompute) {
    auto m = pipeline_model_state_bytes(r.model, stage, p.dp, precision, r.grad_accum_dtype, r.persistence_threshold,
                                        r.tp, r.pp, ps.stage, r.pipeline_split);
    const auto act = estimate_pipeline_stage_activations(r.model, r.micro_batch, r.seq_len, precision, recompute, r.tp,
                                                         r.pp, ps.stage, ps.micro_batches_alive, r.fused_attention,
                                                         r.sequence_parallel, r.pipeline_split);
    m.activations = act.held;
    m.recompute_peak = act.recompute_peak;
    m.backward_peak = backward_peak_bytes(r.model, r.micro_batch, r.seq_len, precision, r.tp, ps.layers,
                                          ps.stage == r.pp - 1, ps.stage == 0, r.products_in_fp32, r.fused_attention);
    const auto stage_layout =
        parallel::FlatLayout::build(stage_shape(r.model, r.tp, r.pp, ps.stage, r.pipeline_split), p.dp);
    const int64_t largest = stage_layout.largest_unit_numel(), cb = compute_bytes(precision);
    m.comm_buffers = stage == 0 ? 0 : stage == 1 ? stage_layout.shard_numel() * cb : 2 * largest * cb;
    m.comm_buffers += bucket_buffer_bytes(r, stage, largest, p.dp, cb);
    if (stage == 3)
      m.gathered_peak = parallel::stage3_gathered_peak_numel(stage_layout, r.prefetch, r.persistence_threshold,
                                                             ps.first_unit, ps.last_unit, ps.micro_batches_alive) *
                        cb;
    return m;
  };
  const double model_bytes = static_cast<double>(bare ? p.parameters : p.rank_parameters) * c;
  p.pipeline_bubble = r.pp > 1 ? double(r.pp - 1) / double(r.accumulation + r.pp - 1) : 0;
  p.activation_method =
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
  for (int stage = 0; stage <= 3; ++stage) {
    if (r.zero_stage >= 0 && stage != r.zero_stage) continue;
    StagePlan sp;
    sp.stage = stage;
    sp.memory = bare ? bare_model_states(p.parameters, stage, p.dp, r.precision)
                     : model_state_bytes(r.model, stage, p.dp, r.precision, r.grad_accum_dtype, r.persistence_threshold,
                                         r.tp);
    if (slice > 1) {
      for (int64_t* v : {&sp.memory.compute_params, &sp.memory.gradients, &sp.memory.master_params,
                         &sp.memory.optimizer_states})
        *v /= slice;
    }
    if (pipeline) {
      // Each pipeline stage on its own; the largest total is what must fit.
      for (auto& ps : p.pipeline_stages) {
        ps.memory.push_back(pipeline_memory(ps, stage, r.precision, r.recompute));
        if (ps.stage == 0 || ps.memory.back().total() > sp.memory.total()) {
          sp.memory = ps.memory.back();
          sp.peak_pipeline_stage = ps.stage;
        }
      }
    } else if (!bare) {
      const auto act = estimate_activations(r.model, r.micro_batch, r.seq_len, r.precision, r.recompute, r.tp, r.pp,
                                            r.fused_attention, r.sequence_parallel);
      sp.memory.activations = act.held;
      sp.memory.recompute_peak = act.recompute_peak;
      sp.memory.backward_peak = backward_peak_bytes(r.model, r.micro_batch, r.seq_len, r.precision, r.tp,
                                                    r.model.num_hidden_layers, true, true, r.products_in_fp32,
                                                    r.fused_attention);
      const int64_t largest = layout.largest_unit_numel() / slice;
      sp.memory.comm_buffers = stage == 0 ? 0 : stage == 1 ? layout.shard_numel() / slice * c : 2 * largest * c;
      sp.memory.comm_buffers += bucket_buffer_bytes(r, stage, largest, p.dp, c);
      if (stage == 3)
        sp.memory.gathered_peak = parallel::stage3_gathered_peak_numel(layout, r.prefetch, r.persistence_threshold) / slice * c;
    }
    // Communication per step per rank (message bytes as the trainer counts them: each rank's input).
    // Data parallelism moves this rank's parameters (its tensor-parallel shards).
    // Pipeline: the stage holding the most parameters.
    const double psi_bytes = pipeline ? static_cast<double>(pipeline_largest_params) * c : model_bytes / slice;
    if (p.dp > 1) {
      if (stage == 0) sp.comm_bytes["all_reduce"] = psi_bytes;
      if (stage >= 1) sp.comm_bytes["reduce_scatter"] = psi_bytes * (stage >= 2 ? r.accumulation : 1);
      if (stage <= 2 && stage >= 1) sp.comm_bytes["all_gather"] = psi_bytes / p.dp;
      if (stage == 3) sp.comm_bytes["all_gather"] = 2 * psi_bytes / p.dp * r.accumulation;
      sp.comm_model_multiple = stage == 3 ? 3.0 * r.accumulation : stage == 2 ? 1.0 * r.accumulation + 1 : 2.0;
    }
    if (!bare && r.tp > 1) {
      // The busiest pipeline stage (an approximation): ceil(L/pp) layers, the embedding and the head.
      auto stage_model = r.model;
      stage_model.num_hidden_layers = (r.model.num_hidden_layers + r.pp - 1) / r.pp;
      for (const auto& [op, bytes] : tensor_parallel_comm_bytes(stage_model, r.micro_batch, r.seq_len, r.accumulation,
                                                                r.precision, r.recompute, r.tp, r.sequence_parallel))
        sp.comm_bytes[op] = bytes;
    }
    if (r.pp > 1) sp.comm_bytes["p2p"] = 2.0 * r.micro_batch * r.seq_len * r.model.hidden_size * c * r.accumulation;
    if (r.device_memory > 0) {
      sp.headroom = static_cast<int64_t>(r.device_memory) - sp.memory.total();
      sp.fits = sp.headroom >= 0;
    }
    p.stages.push_back(sp);
  }

  // Recommendation: the decision tree users know, one reason per step.
  auto total_for = [&](int stage, const std::string& recompute, const std::string& precision) {
    if (bare) return bare_model_states(p.parameters, stage, p.dp, precision).total();
    if (pipeline) {
      int64_t peak = 0;
      for (const auto& ps : p.pipeline_stages) {
        const auto m = pipeline_memory(ps, stage, precision, recompute);
        peak = std::max(peak, m.model_states() + m.activations + m.recompute_peak + m.backward_peak);
      }
      return peak;
    }
    auto m = model_state_bytes(r.model, stage, p.dp, precision, r.grad_accum_dtype, r.persistence_threshold, r.tp);
    return m.total() / slice + activation_bytes(r.model, r.micro_batch, r.seq_len, precision, recompute, r.tp, r.pp,
                                               r.fused_attention, r.sequence_parallel) +
           backward_peak_bytes(r.model, r.micro_batch, r.seq_len, precision, r.tp, r.model.num_hidden_layers, true,
                               true, r.products_in_fp32, r.fused_attention);
  };
  // Without a reason to change it, the recommendation is the requested layout.
  p.recommended_stage = std::max(0, r.zero_stage);
  p.recommended_tp = r.tp;
  p.recommended_pp = r.pp;
  p.recommended_sequence_parallel = r.sequence_parallel;
  p.recommended_recompute = r.recompute;
  if (r.device_memory <= 0) {
    p.reasons.push_back("no --device-memory given: showing the numbers without a recommendation");
    return p;
  }
  const double need = static_cast<double>(total_for(0, "none", r.precision));
  const double ratio = need / r.device_memory;
  char line[256];
  std::snprintf(line, sizeof line, "data parallel needs %s per rank, %.2fx the %s device", gb(need).c_str(), ratio,
                gb(r.device_memory).c_str());
  p.reasons.push_back(line);
  if (ratio <= 1) {
    p.recommended_stage = 0;
    p.reasons.push_back("it fits one device: plain data parallelism (stage 0), no sharding overhead");
  } else if (ratio <= 2 && total_for(2, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 2;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by up to 2x: ZeRO-2 shards gradients and optimizer states, bf16 halves weights and "
                        "activations, recomputation keeps one layer's activations");
  } else if (ratio <= 8 && total_for(3, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 3;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by 2-8x: ZeRO-3 also shards the parameters (1.5x the communication of stage 2)");
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
    p.recommended_pp = std::max(1, r.devices / 8 >= 2 ? std::min(r.devices / 8, 8) : 1);
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
  return p;
}

namespace {
nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"compute_params", m.compute_params},     {"gradients", m.gradients},
          {"master_params", m.master_params},       {"optimizer_states", m.optimizer_states},
          {"activations", m.activations},           {"recompute_peak", m.recompute_peak},
          {"comm_buffers", m.comm_buffers},         {"gathered_peak", m.gathered_peak},
          {"backward_peak", m.backward_peak},
          {"total_model_states", m.model_states()}, {"total", m.total()}};
}
}  // namespace

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    auto j = memory_json(s.memory);
    j["stage"] = s.stage;
    j["fits"] = s.fits;
    j["headroom"] = s.headroom;
    j["comm_bytes_per_step"] = s.comm_bytes;
    j["comm_model_multiple"] = s.comm_model_multiple;
    if (!p.pipeline_stages.empty()) j["peak_pipeline_stage"] = s.peak_pipeline_stage;
    stages.push_back(j);
  }
  // Per pipeline stage: what it runs and holds, and its memory at each ZeRO stage planned.
  nlohmann::json pipeline = nlohmann::json::array();
  for (const auto& ps : p.pipeline_stages) {
    nlohmann::json memory = nlohmann::json::array();
    for (size_t i = 0; i < ps.memory.size() && i < p.stages.size(); ++i) {
      auto j = memory_json(ps.memory[i]);
      j["zero_stage"] = p.stages[i].stage;
      memory.push_back(j);
    }
    pipeline.push_back({{"stage", ps.stage},
                        {"first_unit", ps.first_unit},
                        {"last_unit", ps.last_unit},
                        {"layers", ps.layers},
                        {"embedding", ps.first_unit == 0},
                        {"head", ps.stage + 1 == static_cast<int>(p.pipeline_stages.size())},
                        {"embedding_copy", ps.embedding_copy},
                        {"parameters", ps.parameters},
                        {"micro_batches_alive", ps.micro_batches_alive},
                        {"memory", memory}});
  }
  const auto& r = p.request;
  return {{"model", r.model_name},
          {"parameters", p.parameters},
          {"parameters_per_rank", p.rank_parameters},
          {"devices", r.devices},
          {"dp", p.dp},
          {"tp", r.tp},
          {"sequence_parallel", r.sequence_parallel},
          {"pp", r.pp},
          {"device_memory", r.device_memory},
          {"micro_batch", r.micro_batch},
          {"seq_len", r.seq_len},
          {"accumulation", r.accumulation},
          {"precision", r.precision},
          {"products_in_fp32", r.products_in_fp32},
          {"recompute", r.recompute},
          {"activation_method", p.activation_method},
          {"pipeline_bubble", p.pipeline_bubble},
          {"pipeline_schedule", r.pipeline_schedule},
          {"pipeline_stages", pipeline},
          {"stages", stages},
          {"recommendation",
           {{"zero_stage", p.recommended_stage},
            {"tp", p.recommended_tp},
            {"sequence_parallel", p.recommended_sequence_parallel},
            {"pp", p.recommended_pp},
            {"recompute", p.recommended_recompute},
            {"reasons", p.reasons}}}};
}

namespace {
// The per-pipeline-stage table at one ZeRO stage: the requested one, else the recommended one when
// planned, else stage 0.
void format_pipeline_stages(std::ostringstream& out, const Plan& p) {
  const auto& r = p.request;
  size_t z = 0;
  const int want = r.zero_stage >= 0 ? r.zero_stage : p.recommended_stage;
  for (size_t i = 0; i < p.stages.size(); ++i)
    if (p.stages[i].stage == want) z = i;
  char line[512];
  const int L = static_cast<int>(r.model.num_hidden_layers);
  std::snprintf(line, sizeof line,
                "\nper pipeline stage (zero stage %d, %s schedule, %lld micro-batches; stage 0 runs the embedding, "
                "stage %d the final norm and head)\n",
                p.stages[z].stage, r.pipeline_schedule == "gpipe" ? "GPipe" : "1F1B",
                static_cast<long long>(r.accumulation), r.pp - 1);
  out << line;
  out << "per rank            ";
  for (const auto& ps : p.pipeline_stages) {
    std::snprintf(line, sizeof line, "%13s", ("pp stage " + std::to_string(ps.stage)).c_str());
    out << line;
  }
  out << "\n";
  auto text_row = [&](const char* name, auto get) {
    std::snprintf(line, sizeof line, "%-20s", name);
    out << line;
    for (const auto& ps : p.pipeline_stages) {
      std::snprintf(line, sizeof line, "%13s", get(ps).c_str());
      out << line;
    }
    out << "\n";
  };
  text_row("decoder layers", [&](const PipelineStagePlan& ps) {
    // Units [first, last]: layer i is unit 1 + i.
    const int first = std::max<int>(0, static_cast<int>(ps.first_unit) - 1);
    const int last = std::min<int>(L - 1, static_cast<int>(ps.last_unit) - 1);
    return std::to_string(first) + "-" + std::to_string(last) + " (" + std::to_string(ps.layers) + ")";
  });
  text_row("also", [&](const PipelineStagePlan& ps) {
    std::string s;
    if (ps.first_unit == 0) s = "embedding";
    if (ps.stage == r.pp - 1) s += std::string(s.empty() ? "" : "+") + (ps.embedding_copy ? "head+emb" : "head");
    return s.empty() ? std::string("-") : s;
  });
  text_row("parameters", [](const PipelineStagePlan& ps) {
    char b[32];
    std::snprintf(b, sizeof b, ps.parameters >= 1e9 ? "%.2fB" : "%.1fM",
                  ps.parameters >= 1e9 ? ps.parameters / 1e9 : ps.parameters / 1e6);
    return std::string(b);
  });
  text_row("micro-batches alive", [](const PipelineStagePlan& ps) { return std::to_string(ps.micro_batches_alive); });
  auto row = [&](const char* name, auto get) {
    text_row(name, [&](const PipelineStagePlan& ps) { return gb(static_cast<double>(get(ps.memory[z]))); });
  };
  row("compute params", [](const MemoryBreakdown& m) { return m.compute_params; });
  row("gradients", [](const MemoryBreakdown& m) { return m.gradients; });
  row("fp32 master params", [](const MemoryBreakdown& m) { return m.master_params; });
  row("optimizer states", [](const MemoryBreakdown& m) { return m.optimizer_states; });
  row("= model states", [](const MemoryBreakdown& m) { return m.model_states(); });
  row("activations", [](const MemoryBreakdown& m) { return m.activations; });
  if (r.recompute != "none") row("recomputed in backward", [](const MemoryBreakdown& m) { return m.recompute_peak; });
  row("comm buffers", [](const MemoryBreakdown& m) { return m.comm_buffers; });
  row("gathered working set", [](const MemoryBreakdown& m) { return m.gathered_peak; });
  row("backward temporaries", [](const MemoryBreakdown& m) { return m.backward_peak; });
  row("= total", [](const MemoryBreakdown& m) { return m.total(); });
  if (r.device_memory > 0) {
    row("headroom", [&](const MemoryBreakdown& m) { return static_cast<int64_t>(r.device_memory) - m.total(); });
    text_row("fits", [&](const PipelineStagePlan& ps) {
      return std::string(ps.memory[z].total() <= static_cast<int64_t>(r.device_memory) ? "yes" : "NO");
    });
  }
  const auto& peak = p.stages[z];
  std::snprintf(line, sizeof line, "peak: pipeline stage %d, %s per rank%s\n", peak.peak_pipeline_stage,
                gb(static_cast<double>(peak.memory.total())).c_str(),
                r.device_memory > 0 ? (peak.fits ? " (fits device_memory)" : " (does NOT fit device_memory)") : "");
  out << line;
  if (p.stages.size() > 1 || want != 0)
    out << "(the trainer runs pipeline stages with zero stage 0 today; other zero stages are predictions)\n";
}
}  // namespace

std::string format_plan(const Plan& p) {
  const auto& r = p.request;
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "plan: %s, %.3gB parameters | %d device(s): dp=%d tp=%d%s pp=%d | %s | micro-batch %lld x seq %lld x accumulation %lld | recompute %s\n",
                r.model_name.c_str(), p.parameters / 1e9, r.devices, p.dp, r.tp, r.sequence_parallel ? " (sp)" : "",
                r.pp, r.precision.c_str(), static_cast<long long>(r.micro_batch), static_cast<long long>(r.seq_len),
                static_cast<long long>(r.accumulation), r.recompute.c_str());
  out << line;
  if (r.tp > 1 && r.params_override == 0) {
    std::snprintf(line, sizeof line, "tensor parallel: each rank holds %lld of the %lld parameters (Megatron layout%s)\n",
                  static_cast<long long>(p.rank_parameters), static_cast<long long>(p.parameters),
                  r.tp > r.model.num_key_value_heads ? "; KV heads replicated on tp/KV ranks" : "");
    out << line;
  }
  out << "activations: " << p.activation_method << "\n\n";
  if (!p.pipeline_stages.empty())
    out << "per rank of the largest pipeline stage (the pipeline stage in the last row; each stage below)\n";
  out << "per rank            ";
  for (const auto& s : p.stages) out << "      stage " << s.stage;
  out << "\n";
  auto row = [&](const char* name, auto get) {
    std::snprintf(line, sizeof line, "%-20s", name);
    out << line;
    for (const auto& s : p.stages) {
      std::snprintf(line, sizeof line, "%13s", gb(static_cast<double>(get(s))).c_str());
      out << line;
    }
    out << "\n";
  };
  row("compute params", [](const StagePlan& s) { return s.memory.compute_params; });
  row("gradients", [](const StagePlan& s) { return s.memory.gradients; });
  row("fp32 master params", [](const StagePlan& s) { return s.memory.master_params; });
  row("optimizer states", [](const StagePlan& s) { return s.memory.optimizer_states; });
  row("= model states", [](const StagePlan& s) { return s.memory.model_states(); });
  row("activations", [](const StagePlan& s) { return s.memory.activations; });
  if (r.recompute != "none") row("recomputed in backward", [](const StagePlan& s) { return s.memory.recompute_peak; });
  row("comm buffers", [](const StagePlan& s) { return s.memory.comm_buffers; });
  row("gathered working set", [](const StagePlan& s) { return s.memory.gathered_peak; });
  row("backward temporaries", [](const StagePlan& s) { return s.memory.backward_peak; });
  row("= total", [](const StagePlan& s) { return s.memory.total(); });
  if (r.device_memory > 0) {
    row("headroom", [](const StagePlan& s) { return s.headroom; });
    out << "fits                ";
    for (const auto& s : p.stages) out << (s.fits ? "          yes" : "           NO");
    out << "\n";
  }
  if (!p.pipeline_stages.empty()) {
    out << "largest pp stage    ";
    for (const auto& s : p.stages) {
      std::snprintf(line, sizeof line, "%13d", s.peak_pipeline_stage);
      out << line;
    }
    out << "\n";
    format_pipeline_stages(out, p);
  }
  out << "\ncommunication per step per rank (x model size = algorithmic volume)\n";
  for (const auto& s : p.stages) {
    std::snprintf(line, sizeof line, "  stage %d: %.2fx", s.stage, s.comm_model_multiple);
    out << line;
    for (const auto& [op, bytes] : s.comm_bytes)
      if (op.rfind("tp_", 0) != 0) out << "  " << op << " " << gb(bytes);
    out << "\n";
  }
  // The tensor-parallel collectives are the same at every ZeRO stage.
  if (!p.stages.empty() && r.tp > 1 && r.params_override == 0) {
    out << "  tensor parallel:";
    for (const auto& [op, bytes] : p.stages.front().comm_bytes)
      if (op.rfind("tp_", 0) == 0) out << "  " << op << " " << gb(bytes);
    out << (r.sequence_parallel ? "\n    (per layer and micro-step 4 all-gathers of b*s*h/t and 4 reduce-scatters of b*s*h, "
                                  "the volume of 4 all-reduces of b*s*h; plus the embedding and head)\n"
                                : "\n    (per layer and micro-step 2 all-reduces of b*s*h in forward, 2 in backward; plus the "
                                  "embedding and head, and the vocab-parallel loss's 3 of b*s)\n");
  }
  if (r.pp > 1) {
    std::snprintf(line, sizeof line, "pipeline bubble (p-1)/(m+p-1) = %.3f\n", p.pipeline_bubble);
    out << line;
  }
  if (r.params_override == 0) {
    std::snprintf(line, sizeof line, "for comparison, Korthikanti et al. 2022 (GPT layer, 16-bit, no recomputation): %s of activations per rank\n",
                  gb(korthikanti_bytes(r.model, r.micro_batch, r.seq_len, r.tp, r.pp, r.sequence_parallel)).c_str());
    out << line;
  }
  if (!p.stages.empty() && p.stages[0].stage == 0 && p.dp > 1) {
    const double total = static_cast<double>(p.stages[0].memory.model_states()) * p.dp;
    std::snprintf(line, sizeof line, "data parallel keeps %s of model states in total, %s of it redundant\n",
                  gb(total).c_str(), gb(total - p.stages[0].memory.model_states()).c_str());
    out << line;
  }
  out << "\nrecommendation: zero stage " << p.recommended_stage << ", tp " << p.recommended_tp
      << (p.recommended_sequence_parallel ? " (sequence parallel)" : "") << ", pp " << p.recommended_pp
      << ", recompute " << p.recommended_recompute << "\n";
  for (const auto& why : p.reasons) out << "  - " << why << "\n";
  return out.str();
}

nlohmann::json recommended_config(const Plan& p) {
  const auto& r = p.request;
  nlohmann::json model = {{"preset", r.model_name}};
  if (r.model_name.empty() || r.model_name.rfind("init:", 0) == 0) model = model::to_hf_json(r.model);
  for (const char* k : {"architectures", "torch_dtype"}) model.erase(k);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", r.micro_batch},
                        {"gradient_accumulation_steps", r.accumulation},
                        {"gradient_clipping", 1.0},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
                        {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 100}, {"cos_min_ratio", 0.1}}}}},
                        {"model", model},
                        {"data", {{"train", "data/brown/train.bin"}, {"val", "data/brown/val.bin"}, {"seq_len", r.seq_len}}},
                        {"zero_optimization", {{"stage", p.recommended_stage}}},
                        {"activation_checkpointing", {{"mode", p.recommended_recompute}}},
                        {"parallelism",
                         {{"tensor_parallel", p.recommended_tp},
                          {"sequence_parallel", p.recommended_sequence_parallel},
                          {"pipeline_parallel", p.recommended_pp},
                          {"pipeline_schedule", r.pipeline_schedule}}},
                        {"steps", 1000}};
  if (p.recommended_pp == r.pp && !r.pipeline_split.empty())
    cfg["parallelism"]["pipeline_split"] = r.pipeline_split;
  if (p.recommended_stage > 0 && r.precision == "bf16") cfg["bf16"] = {{"enabled", true}};
  if (p.recommended_stage > 0 && r.precision == "fp16") cfg["fp16"] = {{"enabled", true}};
  return cfg;
}

}  // namespace shardlm::plan
