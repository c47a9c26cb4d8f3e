// Llama forward pass, transcribed from transformers' modeling_llama.py (eager attention path).
#include "model/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <set>

#include "model/attention.h"
#include "model/family.h"
#include "model/fp32_products.h"
#include "model/moe.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

// Per-layer parameter slots, in HF state_dict order (each bias right after its weight); a family
// holds a subset (describe() lists the ones it has).
// A sparse layer (model/moe.h) has the router, the fused experts and (qwen2_moe) the shared expert
// in place of the dense MLP, in transformers 5's named_parameters() order.
// qwen3's q_norm / k_norm follow o_proj; qwen3_moe registers its experts before the router
// (kRouterLast), mixtral and qwen2_moe the router first.
enum Slot : int {
  kQ, kQBias, kK, kKBias, kV, kVBias, kO, kOBias, kQNorm, kKNorm, kGate, kGateBias, kUp, kUpBias, kDown, kDownBias,
  kRouter, kExpertsGateUp, kExpertsDown, kRouterLast, kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate,
  kInputNorm, kPostNorm, kSlots
};
const char* kSlotNames[kSlots] = {
    "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
    "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",    "mlp.gate_proj.bias",    "mlp.up_proj.weight",      "mlp.up_proj.bias",
    "mlp.down_proj.weight",    "mlp.down_proj.bias",
    "mlp.gate.weight",         "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight",
    "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
    "mlp.shared_expert_gate.weight",
    "input_layernorm.weight",  "post_attention_layernorm.weight"};

bool family_has_slot(const LlamaConfig& cfg, int s, int64_t layer) {
  const bool sparse = cfg.is_moe_layer(layer);
  switch (s) {
    case kQBias: case kKBias: case kVBias: return cfg.has_qkv_bias();
    case kOBias: return cfg.has_o_bias();
    case kQNorm: case kKNorm: return cfg.has_qk_norm();
    case kGate: case kUp: case kDown: return !sparse;
    case kGateBias: case kUpBias: case kDownBias: return !sparse && cfg.mlp_bias;
    case kExpertsGateUp: case kExpertsDown: return sparse;
    case kRouter: return sparse && !cfg.family().router_after_experts;
    case kRouterLast: return sparse && cfg.family().router_after_experts;
    case kSharedGate: case kSharedUp: case kSharedDown: case kSharedExpertGate:
      return sparse && cfg.shared_expert_intermediate_size > 0;
    default: return true;
  }
}

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// HF upcasts norms, softmax and the loss to float32; a float64 model (used by tests that need
// exact comparisons) stays in float64.
at::Tensor at_least_float(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? x : x.to(at::kFloat); }

// Matrix products go through model/fp32_products.h: bf16/fp16 products that accumulate in fp32 and
// round once on every processor, as 16-bit hardware computes them.
at::Tensor silu_op(const at::Tensor& x) {
  // CPU fp16 SiLU in fp32, rounded once, as fp16 GPU kernels compute it; on a GPU the kernel does.
  const bool emulate = x.scalar_type() == at::kHalf && x.is_cpu();
  return emulate ? at::silu(x.to(at::kFloat)).to(at::kHalf) : at::silu(x);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto xf = at_least_float(x);
  const auto variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

at::Tensor cross_entropy_loss(const at::Tensor& logits, const at::Tensor& targets) {
  const auto V = logits.size(-1);
  return at::nll_loss(at::log_softmax(at_least_float(logits.reshape({-1, V})), 1), targets.reshape({-1}));
}

at::Tensor cross_entropy_loss_sum(const at::Tensor& logits, const at::Tensor& targets) {
  const auto V = logits.size(-1);
  return at::nll_loss(at::log_softmax(at_least_float(logits.reshape({-1, V})), 1), targets.reshape({-1}), {},
                      at::Reduction::Sum, kIgnoredTarget);
}

ModelShape describe(const LlamaConfig& cfg) {
  cfg.validate();
  const int64_t h = cfg.hidden_size, q = cfg.num_attention_heads * cfg.head_dim(),
                kv = cfg.num_key_value_heads * cfg.head_dim(), f = cfg.intermediate_size;
  ModelShape m;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    m.params.push_back({std::move(name), std::move(shape)});
    return m.params.size() - 1;
  };
  m.units.push_back({"embed", {add("model.embed_tokens.weight", {cfg.vocab_size, h})}, {}});
  const int64_t E = cfg.num_experts, fe = cfg.expert_intermediate_size(), fs = cfg.shared_expert_intermediate_size;
  const std::vector<std::vector<int64_t>> shapes = {
      {q, h}, {q}, {kv, h}, {kv}, {kv, h}, {kv}, {h, q}, {h}, {cfg.head_dim()}, {cfg.head_dim()},
      {f, h}, {f}, {f, h}, {f}, {h, f}, {h},
      {E, h}, {E, 2 * fe, h}, {E, h, fe}, {E, h}, {fs, h}, {fs, h}, {h, fs}, {1, h},
      {h}, {h}};
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    Unit unit{"layers." + std::to_string(i), {}, {}};
    for (int s = 0; s < kSlots; ++s)
      if (family_has_slot(cfg, s, i)) unit.params.push_back(add(layer_prefix(i) + kSlotNames[s], shapes[s]));
    m.units.push_back(std::move(unit));
  }
  Unit head{"head", {add("model.norm.weight", {h})}, {}};
  if (cfg.tie_word_embeddings) head.also_reads.push_back(0);
  else head.params.push_back(add("lm_head.weight", {cfg.vocab_size, h}));
  m.units.push_back(std::move(head));
  return m;
}

int64_t LlamaConfig::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, shape] : describe(*this).params) {
    int64_t e = 1;
    for (auto d : shape) e *= d;
    n += e;
  }
  return n;
}

Llama::Llama(const LlamaConfig& cfg, uint64_t seed, at::ScalarType dtype) : cfg_(cfg) {
  auto shape = describe(cfg_);
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& [name, dims] : shape.params) {
    // Matrices ~ normal(0, initializer_range), drawn in parameter order; RMSNorm weights = 1.
    auto t = dims.size() >= 2 ? at::empty(dims, dtype).normal_(0.0, cfg_.initializer_range, gen) : at::ones(dims, dtype);
    params_.push_back({name, t.set_requires_grad(true)});
  }
  units_ = std::move(shape.units);
  std::map<std::string, int> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].name] = static_cast<int>(i);
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    std::vector<int> slots(kSlots, -1);
    for (int s = 0; s < kSlots; ++s) {
      auto it = index.find(layer_prefix(i) + kSlotNames[s]);
      if (it != index.end()) slots[s] = it->second;
    }
    layer_slots_.push_back(std::move(slots));
  }
  final_norm_ = static_cast<size_t>(index.at("model.norm.weight"));
}

void Llama::to(at::Device device) {
  if (params_.empty() || params_[0].tensor.device() == device) return;
  for (auto& prm : params_) prm.tensor = prm.tensor.detach().to(device).set_requires_grad(true);
  if (frozen_) frozen_->to(device, params_.empty() ? frozen_->weight(0).scalar_type() : params_[0].tensor.scalar_type());
}

int64_t Llama::num_parameters() const {
  int64_t n = 0;
  for (const auto& prm : params_) n += prm.tensor.numel();
  return n;
}

at::Tensor Llama::p(size_t index) const {
  const auto& t = params_[index].tensor;
  return regions_ ? regions_->weight(index, t) : t;
}

at::Tensor Llama::slot(int64_t layer, int s) const {
  const int index = layer_slots_[static_cast<size_t>(layer)][s];
  return index < 0 ? at::Tensor() : base(static_cast<size_t>(index));
}

at::Tensor Llama::projection(const at::Tensor& x, int64_t layer, int weight_slot) const {
  auto y = linear_slot(x, layer, weight_slot);
  const auto bias = slot(layer, weight_slot + 1);
  return bias.defined() ? y + bias : y;
}

at::Tensor Llama::loss(const at::Tensor& logits, const at::Tensor& targets) const {
  auto loss = regions_ ? regions_->loss(logits, targets) : model::cross_entropy_loss(logits, targets);
  // MixtralForCausalLM.forward: loss += router_aux_loss_coef * aux_loss (output_router_logits only).
  if (aux_loss_.defined()) loss = loss + cfg_.router_aux_loss_coef * aux_loss_.to(loss.scalar_type());
  return loss;
}

at::Tensor Llama::loss_sum(const at::Tensor& logits, const at::Tensor& targets) const {
  if (aux_loss_.defined())
    fail("output_router_logits: the load-balancing loss is defined for the mean loss (transformers adds it to the "
         "mean cross-entropy); summed fine-tuning losses with it are not supported. Set output_router_logits to false");
  return regions_ ? regions_->loss_sum(logits, targets) : model::cross_entropy_loss_sum(logits, targets);
}

at::Tensor Llama::decoder_layer(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& segments, at::Tensor* router_logits) const {
  // Heads held here: all of them, or this rank's share under tensor parallelism (read off the
  // weights' shapes; see parallel_regions.h). T is the full sequence: enter() gathers it.
  const auto& slots = layer_slots_[static_cast<size_t>(i)];
  const int64_t D = cfg_.head_dim(), H = base_rows(slots[kQ]) / D, KV = base_rows(slots[kK]) / D;
  auto enter = [this](const at::Tensor& t) { return regions_ ? regions_->enter(t) : t; };
  // A row-parallel product's bias is added once, after leave() (in linear_slot) has summed the ranks'
  // partial products.
  auto add_bias = [this, i](const at::Tensor& t, int bias_slot) {
    const auto b = slot(i, bias_slot);
    return b.defined() ? t + b : t;
  };
  auto h = enter(rms_norm(x, slot(i, kInputNorm), cfg_.rms_norm_eps));
  const int64_t B = h.size(0), T = h.size(1);
  auto q = projection(h, i, kQ).view({B, T, H, D});
  auto k = projection(h, i, kK).view({B, T, KV, D});
  if (cfg_.has_qk_norm()) {  // Qwen3Attention: q_norm(q_proj(x).view(..., D)), the same for k, before RoPE
    q = rms_norm(q, slot(i, kQNorm), cfg_.rms_norm_eps);
    k = rms_norm(k, slot(i, kKNorm), cfg_.rms_norm_eps);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = projection(h, i, kV).view({B, T, KV, D}).transpose(1, 2);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  const int64_t window = cfg_.window_of_layer(i);
  const auto core = [this, window, segments](const std::vector<at::Tensor>& in) {
    return context_ ? context_->attention(in[0], in[1], in[2], attention_, window, segments)
                    : causal_attention(in[0], in[1], in[2], attention_, window, segments);
  };
  auto attn = (recompute_ == Recompute::Selective ? recomputed(core, {q, k, v}) : core({q, k, v}))
                  .transpose(1, 2)
                  .reshape({B, T, H * D});
  auto out = x + add_bias(linear_slot(attn, i, kO, /*leaves=*/true), kOBias);

  h = rms_norm(out, slot(i, kPostNorm), cfg_.rms_norm_eps);
  if (cfg_.is_moe_layer(i)) {
    // The sparse block is no parallel region: under tensor parallelism its weights are replicated
    // and it routes the positions the residual stream holds here (all of them, or this rank's part
    // under sequence parallelism), so it neither enters nor leaves.
    const auto router = cfg_.family().router_after_experts ? slot(i, kRouterLast) : slot(i, kRouter);
    MoeWeights w{router, expert_slot(i, kExpertsGateUp), expert_slot(i, kExpertsDown), slot(i, kSharedGate),
                 slot(i, kSharedUp), slot(i, kSharedDown), slot(i, kSharedExpertGate)};
    at::Tensor logits;
    // Counted once per training forward: in forward, or under full recomputation in the replay
    // (the forward pass runs without autograd, like evaluation).
    const bool count = at::GradMode::is_enabled() && (recompute_ != Recompute::Full || replaying_recomputation());
    std::vector<int64_t> counts;
    const auto y = moe_block(h.reshape({-1, h.size(2)}), w, cfg_, i, cfg_.output_router_logits ? &logits : nullptr,
                             expert_compute_, expert_dispatch_.get(), count ? &counts : nullptr,
                             SequenceShards{context_.get(), h.size(1)});
    if (count) {
      if (expert_tokens_.empty()) expert_tokens_.assign(counts.size(), 0);
      for (size_t e = 0; e < counts.size() && e < expert_tokens_.size(); ++e) expert_tokens_[e] += counts[e];
    }
    if (router_logits) *router_logits = logits;
    return out + y.view(out.sizes());
  }
  h = enter(h);
  auto mlp = linear_slot(silu_op(projection(h, i, kGate)) * projection(h, i, kUp), i, kDown, /*leaves=*/true);
  return out + add_bias(mlp, kDownBias);
}

at::Tensor Llama::forward(const at::Tensor& input_ids, UnitHooks* hooks, const Packing& packing) const {
  if (input_ids.dim() != 2) fail("forward: input_ids must be [batch, seq], got ", input_ids.sizes());
  return forward_units(input_ids, 0, units_.size() - 1, input_ids.size(1), hooks, packing);
}

at::Tensor Llama::forward_units(const at::Tensor& input, size_t first, size_t last, int64_t T,
                                UnitHooks* hooks, const Packing& packing) const {
  if (packing.positions.defined() != packing.segments.defined() ||
      (packing.positions.defined() && (packing.positions.dim() != 2 || packing.positions.size(1) != T ||
                                       packing.segments.sizes() != packing.positions.sizes())))
    fail("forward: packed positions and segments must both be [batch, ", T, "] (internal error)");
  if (T > cfg_.max_position_embeddings && !rope_extends_beyond_max_positions(cfg_))
    fail("sequence length ", T, " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  const size_t head = cfg_.num_hidden_layers + 1;
  if (cfg_.output_router_logits) {
    // The load-balancing loss couples every sparse layer of one forward (model/moe.h): a pipeline
    // stage's forward adds its layers' sums to the stages' before (set_router_sums_before).
    router_logits_.clear();
    router_sums_ = aux_loss_ = at::Tensor();
  }
  const auto sums_before = std::exchange(router_sums_before_, at::Tensor());
  // Runs one unit between its hooks; units are numbered embedding = 0, layer i = 1 + i, head = L + 1.
  auto unit = [&](size_t u, auto&& body) {
    if (hooks) hooks->before_unit(u);
    at::Tensor out = body();
    return hooks ? hooks->after_unit(u, out) : out;
  };
  at::Tensor x = input;
  if (first == 0)
    x = unit(0, [&] { return regions_ ? regions_->leave(regions_->embed(base(0), input)) : at::embedding(base(0), input); });
  // RoPE in float32 as transformers computes it (float64 for a float64 model), then in x's dtype.
  // Packed rows: each position's row of the tables for its position in its sample, [B, 1, T, D],
  // from tables as long as the largest position + 1 (what transformers' dynamic_rope_update reads).
  const auto math = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Context parallelism: this rank's positions are its chunks' places in the whole sequence.
  const at::Tensor positions = packing.positions.defined() || !context_
                                   ? packing.positions
                                   : context_->positions(T, x.device()).unsqueeze(0).expand({x.size(0), T});
  const int64_t table_len = positions.defined() ? positions.max().item<int64_t>() + 1 : T;
  auto [cos, sin] = rope_tables(cfg_, table_len, math, x.device());
  if (positions.defined()) {
    const auto at_positions = [&](const at::Tensor& table) {
      return table.index_select(0, positions.reshape({-1})).view({positions.size(0), T, table.size(1)}).unsqueeze(1);
    };
    cos = at_positions(cos);
    sin = at_positions(sin);
  }
  cos = cos.to(x.scalar_type());
  sin = sin.to(x.scalar_type());
  const at::Tensor segments = packing.segments;
  for (size_t u = std::max<size_t>(first, 1); u <= std::min(last, head - 1); ++u) {
    const int64_t i = static_cast<int64_t>(u) - 1;
    const bool logits_wanted = cfg_.output_router_logits && cfg_.is_moe_layer(i);
    x = unit(u, [&] {
      at::Tensor logits;
      if (recompute_ != Recompute::Full) {
        auto out = decoder_layer(i, x, cos, sin, segments, logits_wanted ? &logits : nullptr);
        if (logits_wanted) router_logits_.push_back(logits);
        return out;
      }
      // Keeps only the layer's input; cos/sin/segments are captured (they need no gradient). With
      // output_router_logits the router logits leave the region as a second output (as
      // torch.utils.checkpoint returns every output of a checkpointed layer): the region returns
      // [hidden states, logits] flattened into one tensor, so the aux loss's gradient reaches the
      // replay in backward, which recomputes both.
      auto packed = recomputed([this, i, cos = cos, sin = sin, segments, logits_wanted](const std::vector<at::Tensor>& in) {
        at::Tensor lg;
        auto out = decoder_layer(i, in[0], cos, sin, segments, logits_wanted ? &lg : nullptr);
        return logits_wanted ? at::cat({out.reshape({-1}), lg.reshape({-1})}) : out;
      }, {x});
      if (!logits_wanted) return packed;
      const int64_t hidden = x.numel();
      router_logits_.push_back(packed.narrow(0, hidden, packed.numel() - hidden).view({-1, cfg_.num_experts}));
      return packed.narrow(0, 0, hidden).view(x.sizes());
    });
  }
  // This forward's load-balancing sums (summed over sequence shards), after those of the stages before.
  auto router_sums = [&] {
    at::Tensor sums;
    if (!router_logits_.empty()) {
      sums = load_balancing_sums(router_logits_, cfg_.num_experts, cfg_.num_experts_per_tok);
      if (regions_) sums = regions_->sum_over_sequence(sums);
      if (context_) sums = context_->sum_over_sequence(sums);  // context parallelism: every rank's chunks
    }
    router_logits_.clear();
    if (sums_before.defined()) sums = sums.defined() ? sums_before.to(sums.options()) + sums : sums_before;
    return sums;
  };
  if (last < head) {
    if (cfg_.output_router_logits) {
      router_sums_ = router_sums();
      if (!router_sums_.defined())
        router_sums_ = at::zeros({2 * cfg_.num_experts + 1}, x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    }
    return x;
  }
  auto logits = unit(head, [&] {
    auto h = rms_norm(x, base(final_norm_), cfg_.rms_norm_eps);
    if (regions_) h = regions_->enter(h);
    return at_least_float(model::linear(h, cfg_.tie_word_embeddings ? base(0) : base(final_norm_ + 1)));
  });
  if (const auto sums = cfg_.output_router_logits ? router_sums() : at::Tensor(); sums.defined()) {
    aux_loss_ = load_balancing_loss_from_sums(sums, cfg_.num_experts);
    router_sums_ = sums.detach();  // every stage's (the pipeline's last stage reads them)
    if (at::GradMode::is_enabled()) {
      const auto value = aux_loss_.detach().to(at::kDouble).reshape({1});
      aux_loss_sum_ = aux_loss_sum_.defined() ? aux_loss_sum_ + value : value;
      ++aux_loss_forwards_;
    }
  }
  return logits;
}

void Llama::load(const std::vector<std::pair<std::string, at::Tensor>>& file_tensors, const std::string& source) {
  std::string problems;
  int count = 0;
  auto problem = [&](const std::string& s) {
    if (++count <= 20) problems += "\n  " + s;
  };
  // Per-expert tensors as save_pretrained writes them -> the fused ones held here (model/moe.h).
  std::vector<std::string> expert_problems;
  const auto tensors = fuse_expert_tensors(cfg_, file_tensors, expert_problems);
  for (const auto& s : expert_problems) problem(s);
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  std::set<std::string> expected;
  for (const auto& prm : params_) {
    expected.insert(prm.name);
    auto it = by_name.find(prm.name);
    if (it == by_name.end()) {
      if (!expert_problems.empty() && prm.name.find(".mlp.experts.") != std::string::npos) continue;  // said above
      problem("missing tensor " + prm.name);
    } else if (it->second->sizes() != prm.tensor.sizes()) {
      std::ostringstream s;
      s << "tensor " << prm.name << " has shape " << it->second->sizes() << ", the model config needs "
        << prm.tensor.sizes();
      problem(s.str());
    }
  }
  for (const auto& [name, t] : tensors) {
    (void)t;
    if (!expected.count(name)) {
      if (name == "lm_head.weight" && cfg_.tie_word_embeddings) problem("tensor lm_head.weight present but the config ties the embeddings (tie_word_embeddings=true)");
      else problem("unexpected tensor " + name);
    }
  }
  if (count > 0)
    fail("weights in '", source, "' do not match the model config (", count, " problem", count > 1 ? "s" : "",
         "):", problems, count > 20 ? "\n  ..." : "", "\nCheck that config.json belongs to these weights.");
  at::NoGradGuard no_grad;
  for (auto& prm : params_) prm.tensor.copy_(*by_name[prm.name]);
}

std::vector<std::pair<std::string, at::Tensor>> Llama::named_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& prm : params_) out.emplace_back(prm.name, prm.tensor.detach());
  return out;
}

}  // namespace shardlm::model
