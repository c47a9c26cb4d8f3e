// See adapters.h.
#include "plan/adapters.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "model/lora.h"
#include "model/quant/four_bit.h"
#include "model/quant/quantized_base.h"
#include "parallel/zero/sharded_frozen_base.h"
#include "plan/plan_internal.h"
#include "plan/quantized_base.h"
#include "util/error.h"

namespace shardlm::plan {

namespace {

// The adapted modules of one layer ("self_attn.q_proj" ...) and their ranks.
using LayerTargets = std::map<std::string, int64_t>;
std::vector<LayerTargets> targets_by_layer(const PlanRequest& r) {
  const auto plan = model::resolve_lora(r.lora_options, r.model);
  std::vector<LayerTargets> out(static_cast<size_t>(r.model.num_hidden_layers));
  for (const auto& t : plan.targets) out[static_cast<size_t>(t.layer)][t.module] = t.r;
  return out;
}

bool trains_in_full(const PlanRequest& r, const std::string& hf_name) { return lora_trains_in_full(r, hf_name); }

}  // namespace

bool lora_trains_in_full(const PlanRequest& r, const std::string& hf_name) {
  if (!r.lora) return true;
  const auto full = model::resolve_lora(r.lora_options, r.model).trained_in_full;
  return std::find(full.begin(), full.end(), hf_name) != full.end();
}

AdapterShapes adapter_shapes(const model::LlamaConfig& cfg, const model::LoraOptions& options) {
  // model::Llama::apply_lora: per unit, its tensors trained in full (base order), then the adapters of
  // its targets (target order), A then B; every unit kept, also an empty one; the rest frozen.
  const auto base = model::describe(cfg);
  const auto plan = model::resolve_lora(options, cfg);
  const std::set<std::string> full(plan.trained_in_full.begin(), plan.trained_in_full.end());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < base.params.size(); ++i) index[base.params[i].first] = i;
  std::vector<size_t> unit_of(base.params.size(), 0);
  for (size_t u = 0; u < base.units.size(); ++u)
    for (size_t i : base.units[u].params) unit_of[i] = u;
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> per_unit(base.units.size());
  AdapterShapes out;
  for (size_t b = 0; b < base.params.size(); ++b) {
    if (full.count(base.params[b].first)) per_unit[unit_of[b]].push_back(base.params[b]);
    else out.frozen.params.push_back(base.params[b]);
  }
  for (const auto& t : plan.targets) {
    const auto prefix = model::lora_adapter_prefix(t);
    const auto it = index.find(model::lora_base_name(t));
    if (it == index.end()) fail("lora: this model has no ", model::lora_base_name(t), " (internal error)");
    const auto [a, b] = model::lora_pair_shapes(t, base.params[it->second].second);
    per_unit[unit_of[it->second]].push_back({prefix + ".lora_A.weight", a});
    per_unit[unit_of[it->second]].push_back({prefix + ".lora_B.weight", b});
  }
  for (size_t u = 0; u < base.units.size(); ++u) {
    model::Unit unit{base.units[u].name, {}, {}};
    for (auto& p : per_unit[u]) {
      unit.params.push_back(out.trainable.params.size());
      out.trainable.params.push_back(std::move(p));
    }
    out.trainable.units.push_back(std::move(unit));
  }
  return out;
}

void check_lora_request(const PlanRequest& r) {
  if (!r.lora) return;
  if (r.params_override > 0) fail("--lora-r needs a model (--model), not a bare parameter count (--params)");
  const auto not_priced = [](const char* flag, int v) {  // the trainer runs these; the planner does not price them
    if (v > 1)
      fail("the planner prices LoRA with ", flag, " ", v, " not yet (only one process, DDP and ZeRO stages 1-3); ",
           "leave out --lora-r to plan the full fine-tuning of the same model, an upper bound, or set ", flag, " to 1");
  };
  const auto not_built = [](const char* flag, int v) {
    if (v > 1) fail("LoRA with ", flag, " ", v, " is not built (the trainer refuses it too); set ", flag, " to 1");
  };
  not_priced("--tp", r.tp);
  not_priced("--pp", r.pp);
  not_built("--ep", r.ep);
  not_priced("--cp", r.cp);
  if (r.load_in_4bit && r.model.is_moe())
    fail("--qlora with a mixture-of-experts model is not built (the experts' 3-D weights are not linears ",
         "bitsandbytes quantizes)");
  if (r.lora_options.r <= 0) fail("--lora-r must be > 0, got ", r.lora_options.r);
  model::resolve_lora(r.lora_options, r.model);  // names a target that matches nothing
}

PlanRequest as_the_planner_prices(PlanRequest r) {
  if (r.lora && (r.tp > 1 || r.pp > 1 || r.cp > 1)) r.lora = r.load_in_4bit = false;
  return r;
}

int64_t planned_frozen_base_bytes(const PlanRequest& r, int stage, int shards) {
  const auto shapes = adapter_shapes(r.model, r.lora_options);
  return frozen_base_bytes(shapes.frozen,
                           {compute_bytes(r.precision), r.load_in_4bit, r.double_quant, stage == 3 ? shards : 1});
}

int64_t gathered_frozen_bytes(const PlanRequest& r, int stage, int shards) {
  if (stage != 3 || shards < 2) return 0;
  const int64_t c = compute_bytes(r.precision);
  int64_t most = 0;
  for (const auto& [name, shape] : adapter_shapes(r.model, r.lora_options).frozen.params) {
    const int64_t n = numel(shape);
    // A plain tensor: the gathered buffer is the weight (its padding included). A 4-bit one: every
    // rank's piece, and the codes and absmax copied out of them (its dequantized form is
    // dequantized_layer_bytes'). The frozen head, gathered in forward, is kept by autograd until its
    // backward; it is the largest tensor of a Llama, and nothing else is gathered beside it.
    most = std::max(most, r.load_in_4bit && model::quant::quantized_by_bitsandbytes(name)
                              ? shards * parallel::four_bit_split(n, r.double_quant, shards).piece_bytes() +
                                    model::quant::four_bit_bytes(n, r.double_quant)
                              : shards * parallel::sharded_tensor_bytes(n, c, shards));
  }
  return most;
}

MemoryBreakdown adapter_model_states(const PlanRequest& r, int stage, int shards) {
  return held_model_states(adapter_shapes(r.model, r.lora_options).trainable, stage, shards, r.precision,
                           r.grad_accum_dtype, r.persistence_threshold, r.optimizer_state_precision, r.min_8bit_size,
                           host_optimizer(r), masters_at(r, r.precision), r.offload_optimizer_nvme_apart,
                           param_offload(r));
}

parallel::FlatLayout adapter_layout(const PlanRequest& r, int shards) {
  return parallel::FlatLayout::build(adapter_shapes(r.model, r.lora_options).trainable, shards);
}

int64_t lora_activations_held(const PlanRequest& r) {
  // What autograd keeps when the base is frozen (model/llama.cpp's ops; measured on the demo model,
  // fp32, one adapted module at a time and all-linear: 0.4-0.8 MB, <= 1%, above this). Per token:
  //  - an RMSNorm keeps its fp32 input (the fp32 residual itself in fp32 runs) only when that input
  //    needs a gradient, and its output only when an adapter reads it (the frozen weight's product
  //    needs no normalised value; the frozen linears keep no input);
  //  - attention keeps q, k, v repeated to all heads and its output (4 x heads x head_dim) when any of
  //    its inputs needs a gradient; o_proj's adapter reads that output;
  //  - the MLP keeps gate, SiLU and up (3 x intermediate) when its input needs a gradient (with only
  //    gate or up adapted in layer 0: 2 or 1 of them), down_proj's adapter its input;
  //  - each adapter its r-wide A output (B's input), and with lora_dropout its own dropped input and mask;
  //  - the head its norm's input, the fp32 log-probabilities, and its input where a product keeps it
  //    (lm_head trained in full; 16-bit products computed in fp32 keep it too).
  // The layer-0 input needs a gradient only when embed_tokens trains; after the first adapter every
  // activation does.
  const auto& cfg = r.model;
  const int64_t c = compute_bytes(r.precision), h = cfg.hidden_size, V = cfg.vocab_size;
  const int64_t q = cfg.num_attention_heads * cfg.head_dim(), f = cfg.intermediate_size;
  const int64_t N = r.micro_batch * r.seq_len, T = r.seq_len;
  const int64_t norm_in = h * (c < 4 ? 4 : c);
  const int64_t attention = 4 * q * c + (r.fused_attention ? cfg.num_attention_heads * 4
                                                           : cfg.num_attention_heads * T * (4 + (c < 4 ? c : 0)));
  const bool dropout = r.lora_options.lora_dropout > 0;
  const auto adapter_inputs = [&](const LayerTargets& t, std::initializer_list<const char*> modules, int64_t width) {
    int64_t n = 0, bytes = 0;
    for (const char* m : modules) n += t.count(m);
    if (n == 0) return int64_t{0};
    bytes = dropout ? n * width * (c + 1) : width * c;  // dropout: each adapter's own dropped copy and mask
    return bytes;
  };
  bool grad = trains_in_full(r, "model.embed_tokens.weight");
  int64_t per_token = 0;
  for (const auto& t : targets_by_layer(r)) {
    const bool attn_adapted = t.count("self_attn.q_proj") || t.count("self_attn.k_proj") || t.count("self_attn.v_proj");
    for (const auto& [module, rank] : t) per_token += rank * c;
    if (grad) per_token += norm_in;
    per_token += adapter_inputs(t, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, h);
    const bool recorded = grad || attn_adapted;
    if (recorded) per_token += attention;
    if (t.count("self_attn.o_proj")) per_token += dropout ? q * (c + 1) : recorded ? 0 : q * c;
    grad = grad || attn_adapted || t.count("self_attn.o_proj");
    if (grad) per_token += norm_in;
    per_token += adapter_inputs(t, {"mlp.gate_proj", "mlp.up_proj"}, h);
    const bool gate = t.count("mlp.gate_proj"), up = t.count("mlp.up_proj");
    per_token += (grad ? 3 : gate ? (up ? 3 : 2) : up ? 1 : 0) * f * c;
    per_token += adapter_inputs(t, {"mlp.down_proj"}, f);
    grad = grad || gate || up || t.count("mlp.down_proj");
  }
  const bool head_trained = trains_in_full(r, "lm_head.weight");
  if (grad) per_token += norm_in + ((head_trained || r.products_in_fp32) ? h * c : 0) + 4 * V;
  else if (head_trained) per_token += h * c + 4 * V;
  return N * per_token;
}

int64_t dequantized_layer_bytes(const PlanRequest& r) {
  if (!r.load_in_4bit) return 0;
  const int64_t c = compute_bytes(r.precision);
  int64_t most = 0;
  for (const auto& [name, shape] : adapter_shapes(r.model, r.lora_options).frozen.params) {
    if (!model::quant::quantized_by_bitsandbytes(name)) continue;
    const int64_t n = numel(shape), blocks = (n + model::quant::kFourBitBlock - 1) / model::quant::kFourBitBlock;
    // dequantize_4bit's fp32 weight, its cast to the compute dtype, the fp32 absmax it undoes.
    most = std::max(most, n * 4 + (c < 4 ? n * c : 0) + (r.double_quant ? blocks * 4 : 0));
  }
  return most;
}

int64_t lora_backward_peak(const PlanRequest& r) {
  // Measured on the demo model (fp32, 512 tokens, q/v adapted and all-linear), the resident set grows
  // over forward + backward by about what a full fine-tuning of the same layers grows by, less the
  // weight gradients: the tensors full fine-tuning keeps for backward are still made by the forward
  // (the normalised values, the MLP's product, the frozen products' outputs), and the heap's holes they
  // leave when freed are not returned; each adapter adds about 1.5 output-widths of temporaries (its
  // B output, scaled, and the sum with the frozen product). Backward's own temporaries are full
  // fine-tuning's, the vocabulary x hidden block included even with a frozen head and embedding:
  // without it the plan fell short by about that block (demo: 6.3 MB of 9 MB; the bench's 134M
  // Llama, 2 threads: 98 MB of 108 MB).
  const auto& cfg = r.model;
  const int64_t c = compute_bytes(r.precision), N = r.micro_batch * r.seq_len;
  const auto full = estimate_activations(cfg, r.micro_batch, r.seq_len, r.precision, "none", 1, 1, r.fused_attention);
  int64_t bytes = backward_peak_bytes(cfg, r.micro_batch, r.seq_len, r.precision, 1, cfg.num_hidden_layers, true, false,
                                      r.products_in_fp32, r.fused_attention);
  bytes += std::max<int64_t>(0, full.held - lora_activations_held(r));
  int64_t out_widths = 0;
  const auto shapes = adapter_shapes(cfg, r.lora_options);
  for (const auto& [name, shape] : shapes.trainable.params)
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".lora_B.weight") == 0) out_widths += shape[0];
  bytes += 3 * N * out_widths * c / 2;
  return bytes + dequantized_layer_bytes(r);
}

namespace {

// Expert adapters (lora.target_parameters; model/lora.h): each adapted expert weight is rebuilt as
// W + scaling * B A in the compute dtype every forward and kept for the experts' backward (the grouped
// products save it), one per adapted weight per micro-batch; backward then forms its full-size gradient
// and that gradient scaled (baddbmm's backward), from which A's and B's come: two of the largest at a
// time on top of the peak (measured on the MoE demo, 2 layers, both weights adapted: planned 140 MB
// against 152 MB with one of them, within 1% with two).
std::pair<int64_t, int64_t> expert_adapter_bytes(const PlanRequest& r) {
  const auto base = model::describe(r.model);
  std::map<std::string, std::vector<int64_t>> shape_of(base.params.begin(), base.params.end());
  const int64_t c = compute_bytes(r.precision);
  int64_t held = 0, largest = 0;
  for (const auto& t : model::resolve_lora(r.lora_options, r.model).targets) {
    if (t.experts == 0) continue;
    const int64_t bytes = numel(shape_of.at(model::lora_base_name(t))) * c;
    held += bytes;
    largest = std::max(largest, bytes);
  }
  return {held, largest};
}

}  // namespace

void set_lora_memory(const PlanRequest& r, int stage, int shards, MemoryBreakdown& m) {
  m.frozen_base = planned_frozen_base_bytes(r, stage, shards);
  m.gathered_peak += gathered_frozen_bytes(r, stage, shards);
  if (r.recompute == "none" && !r.model.is_moe()) {
    m.activations = lora_activations_held(r);
    m.recompute_peak = 0;
    m.backward_peak = lora_backward_peak(r);
  } else {
    // Recomputation and sparse layers: full fine-tuning's activations (an upper bound: the frozen
    // base keeps less), with the dequantized layer on top for QLoRA, and the expert adapters' rebuilt
    // weights (which full fine-tuning does not make).
    m.backward_peak += dequantized_layer_bytes(r);
    const auto [held, largest] = expert_adapter_bytes(r);
    m.activations += held;
    m.backward_peak += 2 * largest;
  }
  // Start-up frees the plain weights that the 4-bit store replaces, and with a 16-bit compute dtype
  // the fp32 frozen tensors cast to it (the model is built in fp32): heap holes the step may reuse.
  const auto shapes = adapter_shapes(r.model, r.lora_options);
  int64_t freed = 0;
  for (const auto& [name, shape] : shapes.frozen.params)
    if ((r.load_in_4bit && model::quant::quantized_by_bitsandbytes(name)) || compute_bytes(r.precision) < 4)
      freed += numel(shape) * 4;
  m.backward_reusable = std::max(m.backward_reusable, std::min(m.backward_peak, freed));
}

AdapterWork adapter_layer_work(const PlanRequest& r, int64_t layer, const MachineProfile& mp) {
  AdapterWork w;
  const auto& cfg = r.model;
  const std::string& dt = r.precision;
  const double T = static_cast<double>(r.micro_batch) * r.seq_len;
  const bool full = r.recompute == "full";
  const auto i = [](double v) { return std::max<int64_t>(1, static_cast<int64_t>(v + 0.5)); };
  // One product of (m, n, k) at the measured rate.
  const auto product = [&](double m, double n, double k) { return 2 * m * n * k / mp.gemm_rate(dt, i(m), i(n), i(k)); };
  const auto plan = model::resolve_lora(r.lora_options, cfg);
  const auto base = model::describe(cfg);
  std::map<std::string, std::vector<int64_t>> shape_of(base.params.begin(), base.params.end());
  for (const auto& t : plan.targets) {
    if (t.layer != layer) continue;
    const auto& s = shape_of[model::lora_base_name(t)];
    if (t.experts > 0) {
      // An expert adapter: W + scaling * B_e A_e per expert (a batched product and two passes over W),
      // then backward's full-size dW of the experts' products (the routed T * k rows), and from it dA, dB.
      const double E = static_cast<double>(s[0]), out = static_cast<double>(s[1]), in = static_cast<double>(s[2]);
      const double rk = static_cast<double>(t.r), rows = T * static_cast<double>(cfg.num_experts_per_tok);
      const double build = product(E * out, in, rk) + 3 * E * out * in * compute_bytes(dt) / mp.stream_bytes_per_s;
      const double dw = product(out, in, rows) + 2 * product(E * out, in, rk);
      w.forward += build;
      w.backward += dw;
      w.weight_backward += dw;
      w.model_flops += 3 * 2 * E * out * in * rk;
      if (full) w.recompute += build;
      continue;
    }
    const double out = static_cast<double>(s[0]), in = static_cast<double>(s[1]), rk = static_cast<double>(t.r);
    // Forward x A^T (T, r, in) then (x A^T) B^T (T, out, r); backward dX of both and dW of both.
    const double fwd = product(T, rk, in) + product(T, out, rk);
    const double dw = product(rk, in, T) + product(out, rk, T);
    const double bwd = product(T, in, rk) + product(T, rk, out) + dw;
    // The scaled B output and its sum with the frozen product: two elementwise passes over T x out.
    const double elementwise = 2 * 3 * T * out * compute_bytes(dt) / mp.stream_bytes_per_s;
    w.forward += fwd + elementwise;
    w.backward += bwd + elementwise;
    w.weight_backward += dw;
    w.model_flops += 3 * 2 * T * rk * (in + out);
    if (full) w.recompute += fwd + elementwise;
  }
  if (r.load_in_4bit) {
    // QLoRA: each decoder linear dequantized before its product, in forward and again in backward:
    // codes and absmax read, the fp32 weight written, and in 16-bit read again and cast.
    const double c = static_cast<double>(compute_bytes(dt));
    double bytes = 0;
    for (const auto& [name, shape] : base.params) {
      if (name.rfind("model.layers." + std::to_string(layer) + ".", 0) != 0) continue;
      if (!model::quant::quantized_by_bitsandbytes(name)) continue;
      const double n = static_cast<double>(numel(shape));
      bytes += n / 2 + n / 64 * (r.double_quant ? 1 : 4) + 4 * n + (c < 4 ? (4 + c) * n : 0);
    }
    const double pass = bytes / mp.stream_bytes_per_s;
    w.forward += pass;
    w.backward += pass;
    if (full) w.recompute += pass;
  }
  return w;
}

std::string lora_summary(const Plan& p) {
  const auto& r = p.request;
  const auto plan = model::resolve_lora(r.lora_options, r.model);
  size_t experts = 0;
  for (const auto& t : plan.targets) experts += t.experts > 0 ? 1 : 0;
  const std::string expert_part = experts ? " and " + std::to_string(experts) + " expert weights" : "";
  char line[400];
  std::snprintf(line, sizeof line,
                "LoRA r=%lld on %zu linears%s%s: %lld trainable parameters of %lld; the frozen base %s, %s%s",
                static_cast<long long>(r.lora_options.r), plan.targets.size() - experts, expert_part.c_str(),
                plan.trained_in_full.empty() ? "" : " (+ modules_to_save in full)", static_cast<long long>(p.rank_parameters),
                static_cast<long long>(p.parameters), r.load_in_4bit ? (r.double_quant ? "4-bit, double-quantized" : "4-bit")
                                                                     : ("in " + r.precision).c_str(),
                p.dp > 1 ? "replicated on every rank at ZeRO stages 0-2, split over the ZeRO group at stage 3"
                                : "replicated on every rank",
                r.load_in_4bit ? " (decoder linears; one dequantized at a time)" : "");
  return line;
}

nlohmann::json lora_json(const PlanRequest& r) {
  if (!r.lora) return nullptr;
  const auto& o = r.lora_options;
  nlohmann::json lora = {{"enabled", true}, {"r", o.r}, {"lora_alpha", o.lora_alpha}, {"lora_dropout", o.lora_dropout}};
  if (!o.target_regex.empty()) lora["target_modules"] = o.target_regex;
  else if (!o.target_modules.empty()) lora["target_modules"] = o.target_modules;
  if (!o.modules_to_save.empty()) lora["modules_to_save"] = o.modules_to_save;
  if (!o.target_parameters.empty()) lora["target_parameters"] = o.target_parameters;
  nlohmann::json out = {{"lora", lora}};
  if (r.load_in_4bit)
    out["quantization"] = {{"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"},
                           {"bnb_4bit_use_double_quant", r.double_quant}};
  return out;
}

}  // namespace shardlm::plan
