// predict_step_time (time_model.h): the planned layout's work in FLOPs and bytes, priced at a measured
// machine's rates.
#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/pipeline/schedule.h"
#include "parallel/zero/zero_memory.h"
#include "plan/adapters.h"
#include "plan/plan_internal.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

// Elementwise bytes of one decoder layer's forward per element (HF's Llama math as model/llama.cpp
// runs it), each a read or a write. Per residual-stream element h: two RMSNorms and two residual adds
// (3 passes each). Per q/k head element, rotary (the two products, rotate_half's copy and the sum: 6
// passes); per MLP element f, SiLU and the gate product (5). Backward touches each again about twice
// (the gradient of every op reads its saved inputs and the incoming gradient and writes one gradient).
// The loss: log-softmax over the vocabulary in fp32, forward and backward, about 6 passes over b s V
// fp32 values, plus the cast of 16-bit logits to fp32 and of their gradient back.
constexpr double kPassesPerRotary = 6, kPassesPerMlp = 5, kBackwardPasses = 2, kLossPasses = 6;

// One RMSNorm (model/llama.cpp rms_norm) per element in a compute dtype of c bytes: the square, its
// mean and the scaling run in fp32 (5 passes of 4 bytes), the weight's product in the compute dtype
// (2 of c); a 16-bit input is first copied to fp32 and the result cast back (c + 4 bytes each), which
// fp32 does not do.
double rms_norm_bytes(double c) { return 20 + 2 * c + (c < 4 ? 2 * (c + 4) : 0); }

// Work of one micro-batch on one rank: seconds by phase.
struct MicroBatchWork {
  double forward = 0, backward = 0, recompute = 0;
  double weight_backward = 0;  // the part of backward that is weight products (dW, zb_h1's W)
  double model_flops = 0;  // forward + backward products and attention, without recomputation
};

// One linear layer y = x W^T with x [T, k_in], W [n_out, k_in]: forward y, backward dX and dW (a
// frozen LoRA base, weight_grad false: dX only).
void add_linear(MicroBatchWork& w, const MachineProfile& mp, const std::string& dt, double T, double k_in,
                double n_out, bool recomputed, bool weight_grad = true) {
  if (T <= 0 || k_in <= 0 || n_out <= 0) return;
  const auto i = [](double v) { return std::max<int64_t>(1, static_cast<int64_t>(std::llround(v))); };
  const double flops = 2 * T * k_in * n_out;
  const double fwd = flops / mp.gemm_rate(dt, i(T), i(n_out), i(k_in));
  const double dw = weight_grad ? flops / mp.gemm_rate(dt, i(n_out), i(k_in), i(T)) : 0;
  const double bwd = flops / mp.gemm_rate(dt, i(T), i(k_in), i(n_out)) + dw;
  w.forward += fwd;
  w.backward += bwd;
  w.weight_backward += dw;
  w.model_flops += (weight_grad ? 3 : 2) * flops;
  if (recomputed) w.recompute += fwd;
}

}  // namespace

std::vector<LinearShape> layer_linears(const model::LlamaConfig& cfg, int64_t layer, double T, int tp) {
  const double t = tp, h = static_cast<double>(cfg.hidden_size), d = static_cast<double>(cfg.head_dim());
  const double H = cfg.num_attention_heads / t, K = std::max(1.0, cfg.num_key_value_heads / t);
  std::vector<LinearShape> out = {{T, h, H * d, 1}, {T, h, K * d, 2}, {T, H * d, h, 1}};  // q; k, v; o
  if (cfg.is_moe_layer(layer)) {
    // Routed experts: top_k of num_experts per token, balanced (each expert sees T k / E tokens);
    // the router's h x E product; a shared expert (and its 1-wide gate) where the family has one.
    const double E = static_cast<double>(cfg.num_experts), k = static_cast<double>(cfg.num_experts_per_tok);
    const double fe = static_cast<double>(cfg.expert_intermediate_size()) / t, te = T * k / E;
    out.push_back({T, h, E, 1});
    out.push_back({te, h, fe, 2 * cfg.num_experts});
    out.push_back({te, fe, h, cfg.num_experts});
    if (cfg.shared_expert_intermediate_size > 0) {
      const double fs = static_cast<double>(cfg.shared_expert_intermediate_size) / t;
      out.push_back({T, h, fs, 2});
      out.push_back({T, fs, h, 1});
      out.push_back({T, h, 1, 1});
    }
  } else {
    const double f = static_cast<double>(cfg.intermediate_size) / t;
    out.push_back({T, h, f, 2});  // gate, up
    out.push_back({T, f, h, 1});  // down
  }
  return out;
}

namespace {

// The MLP's elementwise elements per micro-batch (SiLU and the gate product): T f, or for a sparse
// layer each token's top_k experts and the shared expert.
double mlp_elements(const model::LlamaConfig& cfg, int64_t layer, double T, int tp) {
  if (!cfg.is_moe_layer(layer)) return T * cfg.intermediate_size / tp;
  return T * (static_cast<double>(cfg.num_experts_per_tok) * cfg.expert_intermediate_size() +
              static_cast<double>(cfg.shared_expert_intermediate_size)) / tp;
}

MicroBatchWork decoder_layer_work(const model::LlamaConfig& cfg, int64_t layer, const PlanRequest& r,
                                  const MachineProfile& mp) {
  MicroBatchWork w;
  const std::string& dt = r.precision;
  // Context parallelism: this rank's seq_len / cp positions (T); its queries meet 1 / cp of the causal
  // pairs under the balanced split (parallel/context/chunks.h), so the attention core divides by cp.
  const double t = r.tp, b = static_cast<double>(r.micro_batch), s = static_cast<double>(r.seq_len);
  const double cp = std::max(1, r.cp);
  const double T = b * s / cp, h = static_cast<double>(cfg.hidden_size), d = static_cast<double>(cfg.head_dim());
  const double H = cfg.num_attention_heads / t, K = std::max(1.0, cfg.num_key_value_heads / t);
  const bool full = r.recompute == "full", selective = r.recompute == "selective";
  for (const auto& l : layer_linears(cfg, layer, T, r.tp))
    for (int64_t i = 0; i < l.count; ++i) add_linear(w, mp, dt, l.tokens, l.in, l.out, full, !r.lora);
  if (r.lora) {  // the adapters' products and QLoRA's dequantization (plan/adapters.h)
    const auto a = adapter_layer_work(r, layer, mp);
    w.forward += a.forward, w.backward += a.backward, w.recompute += a.recompute;
    w.weight_backward += a.weight_backward, w.model_flops += a.model_flops;
  }
  // Attention core per sequence and head: QK^T and PV, 2 s s_eff d FLOPs each.
  const double c = static_cast<double>(compute_bytes(dt));
  double attn_fwd = 0, attn_bwd = 0;
  if (r.fused_attention) {
    const double flops = 4 * b * H * s * ((s + 1) / 2) * d / cp;
    attn_fwd = flops / mp.attention_rate(dt, false);
    attn_bwd = flops / mp.attention_rate(dt, true);
    w.model_flops += 3 * flops;
  } else {
    const auto si = static_cast<int64_t>(s), di = static_cast<int64_t>(d);
    const double flops = 2 * b * H * s * s * d / cp;  // each of the two products
    const double softmax = b * H * s * s * c * 5 / cp;  // scores scaled, masked, softmax'd, cast: written and read
    attn_fwd = flops / mp.gemm_rate(dt, si, si, di) + flops / mp.gemm_rate(dt, si, di, si) + softmax / mp.stream_bytes_per_s;
    attn_bwd = 2 * (flops / mp.gemm_rate(dt, si, si, di) + flops / mp.gemm_rate(dt, si, di, si)) +
               kBackwardPasses * softmax / mp.stream_bytes_per_s;
    w.model_flops += 6 * flops;
  }
  w.forward += attn_fwd;
  w.backward += attn_bwd;
  if (full || selective) w.recompute += attn_fwd;
  // Elementwise bytes: the residual stream's h per token is split over tp only with sequence parallelism.
  const double hidden = r.sequence_parallel ? T * h / t : T * h;
  const double bytes = (2 * rms_norm_bytes(c) + 6 * c) * hidden +
                       c * (kPassesPerRotary * T * (H + K) * d + kPassesPerMlp * mlp_elements(cfg, layer, T, r.tp));
  // Tensor parallelism's local copies around its collectives (parallel/tensor/tp_ops.cpp), two
  // regions per layer (attention, MLP), each way: an all-reduce sums a copy of its input (one pass of
  // T h read and written); under sequence parallelism a gather enters each region and a reduce-scatter
  // leaves it, each moving the sequence to the front and back (a copy of the local T h / t piece and
  // one of the whole T h).
  const double region_copies =
      t <= 1 ? 0 : r.sequence_parallel ? 2 * 2 * 2 * c * (1 + 1 / t) * T * h : 2 * 2 * c * T * h;
  const double elementwise = bytes / mp.stream_bytes_per_s, copies = region_copies / mp.stream_bytes_per_s;
  w.forward += elementwise + copies;
  w.backward += kBackwardPasses * elementwise + copies;
  if (full) w.recompute += elementwise + copies;
  return w;
}

// The head (final norm, output product, fp32 log-softmax and its backward) of one micro-batch.
MicroBatchWork head_work(const model::LlamaConfig& cfg, const PlanRequest& r, const MachineProfile& mp) {
  MicroBatchWork w;
  const double T = static_cast<double>(r.micro_batch) * rank_seq_len(r), h = static_cast<double>(cfg.hidden_size);
  const double V = static_cast<double>(cfg.vocab_size) / r.tp;
  add_linear(w, mp, r.precision, T, h, V, false, lora_trains_in_full(r, "lm_head.weight"));
  const double c = static_cast<double>(compute_bytes(r.precision));
  const double loss = kLossPasses * T * V * 4 / mp.stream_bytes_per_s;
  const double cast = c < 4 ? T * V * (c + 4) / mp.stream_bytes_per_s : 0;  // each way
  const double norm = rms_norm_bytes(c) * (r.sequence_parallel ? T / r.tp : T) * h / mp.stream_bytes_per_s;
  w.forward += loss / 3 + cast + norm;
  w.backward += 2 * loss / 3 + cast + kBackwardPasses * norm;
  return w;
}

void add(MicroBatchWork& into, const MicroBatchWork& w) {
  into.forward += w.forward;
  into.backward += w.backward + w.recompute;
  into.recompute += w.recompute;
  into.weight_backward += w.weight_backward;
  into.model_flops += w.model_flops;
}

// A pipeline stage's decoder layers [first, last), whether it runs the embedding and the head, and
// the parameters one rank of it holds.
struct StageShare {
  int64_t first = 0, last = 0;
  bool head = true;
  double parameters = 0;
};

// Every pipeline stage (one without pipeline parallelism), in order, on the trainer's split.
std::vector<StageShare> stage_shares(const Plan& p) {
  const auto& r = p.request;
  if (p.pipeline_stages.empty()) return {{0, r.model.num_hidden_layers, true, static_cast<double>(p.rank_parameters)}};
  // Interleaved: a rank's v chunks, as one run of as many layers (the layers cost alike).
  const auto counts = stage_layer_counts(r.model, r.pp, r.pipeline_split, r.virtual_pipeline);
  std::vector<StageShare> out;
  int64_t first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out.push_back({first, first + counts[i], i + 1 == counts.size(), static_cast<double>(p.pipeline_stages[i].parameters)});
    first += counts[i];
  }
  return out;
}

// Calls of a data-parallel collective in one step: one per unit (embedding, layers, head), per
// micro-step where it runs in backward.
double calls_of(const std::string& op, const parallel::ZeroPolicies& z, double units, int64_t accumulation) {
  const bool per_micro_step =
      (op.find("reduce_scatter") != std::string::npos && parallel::reduces_every_micro_step(z.grads)) ||
      (op.find("all_gather") != std::string::npos && z.params == parallel::ParamResidency::Sharded);
  return units * (per_micro_step ? static_cast<double>(accumulation) : 1.0);
}

// NVMe offload's transfers, in the engine's units: optimizer-state chunks of min(sub_group_size,
// 65536) elements (state_offload.h; the trainer's default), parameter files of one unit's shard.
constexpr double kStateChunkElements = 65536;

// What NVMe offload adds to one step (see time_model.h): `out`'s forward_s, backward_s and optimizer_s
// (the optimizer's compute until now) grow by the I/O they wait for.
void add_offload(const Plan& p, const StagePlan& sp, const MachineProfile& mp, StepTimePrediction& out) {
  const auto& r = p.request;
  const auto z = policies_of(r, sp.stage);
  const bool states = z.states == parallel::StatePlacement::Nvme;
  const bool params = z.params_nvme;
  if (!states && !params) return;
  const double m = static_cast<double>(r.accumulation);
  double param_bytes = 0, units = 1;
  if (params) {  // this rank's engines' files (the pipeline stage that must fit: the plan's peak)
    const auto rank = r.pp > 1 ? stage_shape(r.model, r.tp, r.pp, sp.peak_pipeline_stage, r.pipeline_split,
                                             r.virtual_pipeline)
                               : rank_shape(r.model, r.tp);
    const auto off = offloaded_parameters(r, r.shard > 0 ? r.shard : p.dp, rank);
    param_bytes = static_cast<double>(off.bytes);
    units = std::max<double>(1, static_cast<double>(off.units));
  }
  const double unit_bytes = param_bytes / units;
  const auto read = [&](double bytes, double block) { return mp.disk_seconds(bytes, block, false); };
  const auto write = [&](double bytes, double block) { return mp.disk_seconds(bytes, block, true); };
  double io = 0;
  // Forward and backward of each micro-step read every offloaded shard, ahead of its gather.
  if (params && param_bytes > 0) {
    const double pass = read(param_bytes, unit_bytes), first = read(unit_bytes, unit_bytes);
    const double fwd = m * (std::max(0.0, pass - out.forward_s / m) + first);
    const double bwd = m * (std::max(0.0, pass - out.backward_s / m) + first);
    out.forward_s += fwd;
    out.backward_s += bwd;
    out.offload_exposed_s += fwd + bwd;
    io += 2 * m * pass;
  }
  // The step: state chunks (read, stepped, written back) and parameter shards (fp32: read, updated in
  // place, written; 16-bit: the masters cast into them, written), the disk beside the optimizer.
  const bool separate_masters = r.precision != "fp32";
  double step_io = 0, first = 0;
  if (states) {
    const double state_bytes = static_cast<double>(sp.memory.offloaded) - (params ? param_bytes : 0);
    // A chunk's bytes per element: the fp32 master where it is apart from the compute parameters, two moments.
    const std::string& moments = r.optimizer_state_precision;
    const double per_element = (separate_masters ? 4 : 0) + (moments == "8bit" ? 2 : moments == "bf16" ? 4 : 8);
    const double chunk = kStateChunkElements * per_element;
    step_io += mp.disk_stream_seconds(state_bytes, chunk);
    first = read(std::min(chunk, state_bytes), chunk);
  }
  if (params && param_bytes > 0) {
    step_io += separate_masters ? write(param_bytes, unit_bytes) : mp.disk_stream_seconds(param_bytes, unit_bytes);
    if (!states) first = separate_masters ? 0 : read(unit_bytes, unit_bytes);
  }
  const double compute = out.optimizer_s;
  // 16-bit parameters alone: the in-memory step first, then each shard cast and written (nothing to overlap).
  if (params && !states && separate_masters) out.optimizer_s = compute + step_io;
  else out.optimizer_s = std::max(step_io, compute) + first;
  out.offload_exposed_s += out.optimizer_s - compute;
  out.offload_io_s = io + step_io;
}

// ZeRO-Offload's host optimizer (offload_optimizer "cpu" on a GPU, parallel/zero/host_optimizer.h):
// per chunk of min(sub_group_size, 2^22) elements, the gradient goes device->host, the host's AdamW
// steps it, the parameters go host->device; chunk k+1's copy down and chunk k-1's copy up run while
// chunk k steps. The step takes the longer of the link's time (both directions, one copy stream) and
// the host's, plus the first chunk's copy down and the last one's copy up; the device only reads its
// gradients for the norm. `elements`: this rank's shard.
void add_host_optimizer(const PlanRequest& r, const parallel::ZeroPolicies& z, double elements,
                        const MachineProfile& mp, StepTimePrediction& out) {
  const double link = MachineProfile::require(mp.host_link_bytes_per_s, "host_link_bytes_per_s",
                                              "a GPU profile's host link; `shardlm bench machine` measures CPU runs only");
  const double host = MachineProfile::require(mp.host_optimizer_elements_per_s, "host_optimizer_elements_per_s",
                                              "a GPU profile's host AdamW rate; `shardlm bench machine` measures CPU runs only");
  const double c = static_cast<double>(compute_bytes(r.precision));
  // The host gradient buffer's dtype: the fp32 shard that every micro-step's reduce-scatter adds into.
  const double grad = parallel::reduces_every_micro_step(z.grads) && r.grad_accum_dtype != "bf16" ? 4 : c;
  const double chunk = std::min(elements, static_cast<double>(int64_t{1} << 22));
  const double copies = elements * (grad + c) / link;
  const double compute = out.optimizer_s;
  out.optimizer_s = elements * 4 / mp.stream_bytes_per_s + std::max(copies, elements / host) + chunk * (grad + c) / link;
  out.offload_io_s = copies;
  out.offload_exposed_s = out.optimizer_s - compute;
}

}  // namespace

StepTimePrediction predict_step_time(const Plan& p, int stage, const MachineProfile& mp) {
  const auto& r = p.request;
  if (r.params_override > 0) fail("the time model needs a model (--model), not a bare parameter count");
  const StagePlan* sp = nullptr;
  for (const auto& s : p.stages)
    if (s.stage == stage) sp = &s;
  if (!sp) fail("ZeRO stage ", stage, " is not in this plan");
  const auto z = policies_of(r, stage);  // what the stage's engine runs, and when
  StepTimePrediction out;
  // Each stage's work per micro-batch; the busiest stage's rank is the one predicted.
  const auto shares = stage_shares(p);
  std::vector<MicroBatchWork> work;
  size_t busiest = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    MicroBatchWork w;
    for (int64_t l = shares[i].first; l < shares[i].last; ++l) add(w, decoder_layer_work(r.model, l, r, mp));
    if (shares[i].head) add(w, head_work(r.model, r, mp));
    work.push_back(w);
    if (w.forward + w.backward > work[busiest].forward + work[busiest].backward) busiest = i;
  }
  const auto& share = shares[busiest];
  const auto& mb = work[busiest];
  const double m = static_cast<double>(r.accumulation);
  out.forward_s = m * mb.forward;
  out.backward_s = m * mb.backward;
  out.recompute_s = m * mb.recompute;
  // The pipeline: every schedule's action lists run with each stage's times (parallel/pipeline/
  // schedule.h's simulate_schedule), and the bubble is what the simulation leaves the busiest stage idle.
  // On balanced stages GPipe and 1F1B both wait (p - 1) micro-batch times, the fraction (p - 1) / (m + p - 1)
  // of the step's compute; on unbalanced ones 1F1B waits less (a lighter stage's backward of one
  // micro-batch runs while the heavier one still runs forwards; GPipe waits for every forward first),
  // which the formula does not show: measured at m = 2 with a stage 0 1.4x heavier than stage 1,
  // 1F1B's step was 0.90 of GPipe's, as simulated. Interleaved 1F1B: a chunk costs 1/v of its rank's
  // work. ZB-H1 (schedule.h, model/weight_grad_deferral.h): W is the stage's weight products (dW of
  // every linear), B the rest of its backward (the dX products, attention's and the elementwise
  // backward), so B + W is the backward.
  const auto schedule = parallel::pp::parse_schedule(r.pipeline_schedule);
  if (work.size() > 1) {
    const int p = static_cast<int>(work.size()), v = std::max(1, r.virtual_pipeline);
    std::vector<parallel::pp::ActionCost> costs(p * v);
    for (int k = 0; k < p * v; ++k) {
      const auto& w = work[k % p];
      costs[k] = {w.forward / v, w.backward / v, w.backward - w.weight_backward, w.weight_backward};
    }
    const auto sim = parallel::pp::simulate_schedule(schedule, p, r.accumulation, v, costs);
    out.bubble_s = std::max(0.0, sim.span - sim.busy[busiest]);
  }
  out.model_flops = m * mb.model_flops;

  // Optimizer: the fp32 elements this rank updates; over its gradients (g bytes each) the norm's read,
  // clipping's read and write (optim::clip_grads scales them whenever gradient_clipping > 0) and the
  // zeroing for the next step, which clears the whole model's gradients where they are reduced once
  // (stages 0 and 1: the engine's grad_flat, DDP's buckets) and the shard where every micro-step
  // reduces them (2 and 3); the masters' cast to the compute dtype.
  const int shards = r.shard > 0 ? r.shard : p.dp;
  const double elements = share.parameters / (parallel::steps_a_shard(z.grads) ? shards : 1);
  const double g = r.precision == "fp32" || r.grad_accum_dtype != "bf16" ? 4 : 2;
  const double cleared = parallel::reduces_every_micro_step(z.grads) ? elements : share.parameters;
  out.optimizer_s = elements / mp.optimizer_rate(r.optimizer_state_precision) +
                    (elements * g * (r.gradient_clipping > 0 ? 3 : 1) + cleared * g) / mp.stream_bytes_per_s;
  if (r.precision != "fp32") out.optimizer_s += elements * 6 / mp.stream_bytes_per_s;
  if (z.states == parallel::StatePlacement::Host) add_host_optimizer(r, z, elements, mp, out);
  add_offload(p, *sp, mp, out);

  // Communication.
  const double units = static_cast<double>(share.last - share.first) + (share.first == 0 ? 1 : 0) + (share.head ? 1 : 0);
  double hideable_backward = 0, hideable_both = 0;
  for (const auto& [op, bytes] : sp->comm_bytes) {
    int n = 1;
    double calls = 1, size = bytes;
    std::string base = op;
    if (op.rfind("tp_", 0) == 0) {
      n = r.tp;
      base = op.substr(3);
      if (base == "kv_all_reduce") base = "all_reduce";
      calls = m * (4.0 * (share.last - share.first) + 2);
    } else if (op.rfind("cp_", 0) == 0) {  // context parallelism (plan/context.cpp)
      const auto k = context_collective(r, op, static_cast<double>(share.last - share.first));
      n = k.n;
      base = k.base;
      calls = k.calls;
    } else if (op == "p2p") {
      n = 2;
      calls = 2 * m;
    } else if (op == "replica_all_reduce") {
      n = p.dp / shards;
      base = "all_reduce";
      calls = units;
    } else {
      n = shards;
      if (base.rfind("shard_", 0) == 0) base = base.substr(6);
      calls = calls_of(base, z, units, r.accumulation);
    }
    size = bytes / calls;
    if (base == "all_gather") size *= n;  // nccl-tests' size: the gathered buffer
    const double seconds = calls * mp.collective_seconds(base == "p2p" ? "p2p" : base, size, n);
    out.comm_s[op] = seconds;
    out.comm_s_total += seconds;
    if (op == "cp_p2p") hideable_both += seconds;  // the ring's hops run beside each block's attention
    if (op.rfind("tp_", 0) == 0 || op.rfind("cp_", 0) == 0 || op == "p2p" || op == "replica_all_reduce") continue;
    // DDP's all-reduce and stage 1's reduce-scatter start in the boundary micro-step's backward, stages
    // 2-3's reduce-scatters in every micro-step's (parallel/zero/zero_engine.h): all overlap backward.
    if (base == "all_reduce" || base == "reduce_scatter") hideable_backward += seconds;
    if (base == "all_gather" && z.params == parallel::ParamResidency::Sharded) hideable_both += seconds;
  }
  const double hidden = mp.overlap * (std::min(hideable_backward, out.backward_s) +
                                      std::min(hideable_both, out.forward_s + out.backward_s));
  out.comm_exposed_s = out.comm_s_total - hidden;
  out.step_s = out.forward_s + out.backward_s + out.bubble_s + out.optimizer_s + out.comm_exposed_s;
  out.tokens_per_s = static_cast<double>(r.micro_batch) * r.seq_len * m * p.dp / std::max(1, r.cp) / out.step_s;
  const double peak = mp.gemm_peak(r.precision);
  out.mfu = peak > 0 ? out.model_flops / (out.step_s * peak) : 0;
  return out;
}

nlohmann::json to_json(const StepTimePrediction& t) {
  return {{"step_s", t.step_s},           {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu},
          {"model_flops", t.model_flops}, {"forward_s", t.forward_s},       {"backward_s", t.backward_s},
          {"recompute_s", t.recompute_s}, {"bubble_s", t.bubble_s},         {"optimizer_s", t.optimizer_s},
          {"offload_io_s", t.offload_io_s}, {"offload_exposed_s", t.offload_exposed_s},
          {"comm_s", t.comm_s},           {"comm_s_total", t.comm_s_total}, {"comm_exposed_s", t.comm_exposed_s}};
}

nlohmann::json predicted_json(const Plan& p, const MachineProfile& mp) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    auto j = to_json(predict_step_time(p, s.stage, mp));
    j["stage"] = s.stage;
    stages.push_back(j);
  }
  return {{"machine", mp.description}, {"stages", stages}};
}

std::string format_predicted(const Plan& p, const MachineProfile& mp) {
  std::ostringstream out;
  char line[256];
  const bool offload = p.request.offload_optimizer_nvme || p.request.offload_param_nvme;
  out << "\npredicted step time on " << mp.description << "\n";
  std::snprintf(line, sizeof line, "%-10s %10s %10s %10s %10s %10s %10s %10s %7s%s\n", "zero stage", "forward s",
                "backward s", "recompute", "bubble s", "optimizer", "comm(exp)", "step s", "MFU",
                offload ? "  offload io  offload(exp)" : "");
  out << line;
  for (const auto& s : p.stages) {
    const auto t = predict_step_time(p, s.stage, mp);
    std::snprintf(line, sizeof line, "%-10d %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %6.1f%%", s.stage,
                  t.forward_s, t.backward_s, t.recompute_s, t.bubble_s, t.optimizer_s, t.comm_exposed_s, t.step_s,
                  100 * t.mfu);
    out << line;
    if (offload) {
      std::snprintf(line, sizeof line, "  %10.4f  %12.4f", t.offload_io_s, t.offload_exposed_s);
      out << line;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace shardlm::plan
