// A Llama decoder that computes what Hugging Face LlamaForCausalLM computes, with HF's parameter
// names. It knows nothing of parallelism: parallel strategies see the flat list of parameters and
// the grouping of those parameters into "units" (embedding; each decoder layer; final norm + head),
// and may replace a parameter's tensor (e.g. by a view into a flat buffer) between steps.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/attention.h"
#include "model/context_attention.h"
#include "model/lora.h"
#include "model/llama_config.h"
#include "model/moe.h"
#include "model/parallel_regions.h"
#include "model/rope.h"
#include "model/recompute.h"

namespace shardlm::model {

struct Parameter {
  std::string name;  // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  at::Tensor tensor;
};

// A group of parameters that lives and is communicated together (one decoder layer, ...).
struct Unit {
  std::string name;
  std::vector<size_t> params;      // indices into Llama::parameters()
  std::vector<size_t> also_reads;  // other units whose parameters this unit's forward reads
                                   // (the head reads the embedding when they are tied)
};

// Called around each unit's forward, in order (embedding, layers..., head). Parallel strategies
// use them (ZeRO-3 gathers a unit's parameters before it and releases them after); the model
// only calls them.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_unit(size_t unit) = 0;
  // The rest of the model continues with the returned tensor, so a strategy can put an identity
  // op there whose backward runs right before this unit's backward.
  virtual at::Tensor after_unit(size_t unit, const at::Tensor& output) = 0;
};

// Samples packed into the rows of a batch (fine-tuning; data/loader/data_loader.h): int64 [B, T] positions
// (restarting at 0 in each sample; RoPE reads them as transformers' position_ids) and segment ids
// (attention stays inside a sample). Undefined: positions 0..T-1 and one causal sequence per row.
struct Packing {
  at::Tensor positions, segments;
};

// A target that is not scored by loss_sum (transformers' labels = -100).
constexpr int64_t kIgnoredTarget = -100;

// Parameter names and shapes (HF order) and their units, from the config alone: what the planner
// reads for models far too large to allocate here, and what Llama allocates.
struct ModelShape {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  std::vector<Unit> units;
};
ModelShape describe(const LlamaConfig& cfg);

class Llama {
 public:
  // Allocates parameters (requires_grad) in HF order, initialised from `seed`: normal(0,
  // initializer_range) for matrices, ones for RMSNorm weights (as HF's _init_weights). dtype is
  // float32 for training; float64 lets tests compare parallel layouts without rounding noise.
  Llama(const LlamaConfig& cfg, uint64_t seed, at::ScalarType dtype = at::kFloat);

  const LlamaConfig& config() const { return cfg_; }
  // Moves every parameter to `device` (parallel strategies that build their own buffers on the
  // device read the CPU parameters instead; see ZeroOptions::device).
  void to(at::Device device);
  // How attention is computed (model/attention.h); eager by default.
  void set_attention(Attention a) { attention_ = a; }
  Attention attention() const { return attention_; }
  // Activation checkpointing (model/recompute.h); none by default.
  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  // Where a tensor-parallel strategy communicates (model/parallel_regions.h); none by default.
  // The strategy also replaces the parameters by its shards; the forward reads the local head
  // counts and widths from their shapes.
  void set_regions(std::shared_ptr<ParallelRegions> r) { regions_ = std::move(r); }
  const ParallelRegions* regions() const { return regions_.get(); }
  // Context parallelism (model/context_attention.h): this rank holds some positions of every
  // sequence and attention reaches the others through `c`; none by default.
  void set_context_attention(std::shared_ptr<ContextAttention> c) { context_ = std::move(c); }
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const std::vector<Unit>& units() const { return units_; }
  int64_t num_parameters() const;

  // input_ids: int64 [B, T]. Returns float logits [B, T, vocab] (with tensor parallelism: this
  // rank's slice of the vocabulary).
  at::Tensor forward(const at::Tensor& input_ids, UnitHooks* hooks = nullptr, const Packing& packing = {}) const;
  // Runs units [first, last] only (0 = embedding, 1 + i = layer i, L + 1 = head: a pipeline stage).
  // `input` is token ids when first is the embedding, else the hidden states the unit before
  // produced; the result is hidden states, or logits when last is the head. seq_len: the full
  // sequence (the hidden states may hold a part of it under sequence parallelism).
  // packing: the samples of packed rows (every stage reads the same).
  at::Tensor forward_units(const at::Tensor& input, size_t first, size_t last, int64_t seq_len,
                           UnitHooks* hooks = nullptr, const Packing& packing = {}) const;
  // Mean cross-entropy of forward()'s logits against targets [B, T] (vocab-parallel under TP), plus
  // router_aux_loss_coef times the load-balancing loss of the last forward when the config has
  // output_router_logits (MoE models; transformers adds it the same way).
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const;
  // The load-balancing loss across pipeline stages (output_router_logits; parallel/parallelize.cpp):
  // the running sums [F (E), S (E), rows] (model/moe.h load_balancing_sums) of the stages before, to
  // add to the next forward_units' own (consumed by it; constants, no gradient). After a forward
  // that ends before the head, take_router_sums() returns those sums plus its own layers' (their S
  // with gradient; zeros when none came and it has no sparse layer); after a forward through the
  // head, which forms the loss from them, the same detached.
  void set_router_sums_before(const at::Tensor& sums) const { router_sums_before_ = sums; }
  at::Tensor take_router_sums() const { return std::exchange(router_sums_, at::Tensor()); }
  // Summed cross-entropy over the targets other than kIgnoredTarget (fine-tuning: the trainer
  // divides by the global batch's count of such targets).
  at::Tensor loss_sum(const at::Tensor& logits, const at::Tensor& targets) const;

  // The load-balancing loss (model/moe.h) of the last whole-model forward, before its factor; undefined
  // unless the config has output_router_logits. A metric, and the term loss() adds.
  const at::Tensor& router_aux_loss() const { return aux_loss_; }
  // The load-balancing losses of the training forwards (with gradients) since the last call, which
  // resets them: their sum [1] (detached, no device sync) and how many forwards; {undefined, 0}
  // without output_router_logits. The trainer averages them over the step's micro-batches and
  // data-parallel ranks, so the metric is the same in every layout.
  std::pair<at::Tensor, int64_t> take_router_aux_losses() {
    return {std::exchange(aux_loss_sum_, at::Tensor()), std::exchange(aux_loss_forwards_, 0)};
  }
  // How the experts' products are computed (model/moe.h); grouped by default.
  void set_expert_compute(ExpertCompute c) { expert_compute_ = c; }
  // Where the sparse layers' routed rows are computed (model/moe.h ExpertDispatch); none by default
  // (every expert here). Expert parallelism installs one and replaces the expert tensors by the
  // experts this rank keeps.
  void set_expert_dispatch(std::shared_ptr<ExpertDispatch> d) { expert_dispatch_ = std::move(d); }
  // MoE: the routed (token, expert) assignments per expert [num_experts] of every sparse layer, then
  // the ones a capacity factor dropped (the last element), summed over the training forwards (with
  // gradients; under full activation checkpointing, their replays in backward) since the last
  // call, which resets them. Empty for a dense model.
  std::vector<int64_t> take_expert_tokens() { return std::exchange(expert_tokens_, {}); }

  // LoRA (model/lora.h; llama_lora.cpp). Moves every base tensor but plan.trained_in_full into a
  // PlainFrozenBase and makes parameters() the adapters (PEFT's names without the
  // "base_model.model." prefix: "model.layers.0.self_attn.q_proj.lora_A.weight") plus the tensors
  // trained in full; units() then list those (a unit may hold none). Adapters are drawn from `seed`
  // as plan.init says. Call after load() and before any parallel strategy.
  void apply_lora(const LoraPlan& plan, uint64_t seed);
  bool has_lora() const { return frozen_ != nullptr; }
  const LoraPlan& lora_plan() const { return lora_; }
  // The frozen base (null without LoRA). QLoRA replaces it by a store with the same names in the
  // same order (set_frozen_base checks that) whose weight(k) dequantizes.
  const std::shared_ptr<FrozenBase>& frozen_base() const { return frozen_; }
  void set_frozen_base(std::shared_ptr<FrozenBase> base);
  // Tensor parallelism: replaces every frozen tensor of a PlainFrozenBase by piece(name, tensor)
  // (this rank's shard). A quantized store is refused (QLoRA's blocks run over the whole weight).
  void shard_frozen_base(const std::function<at::Tensor(const std::string&, const at::Tensor&)>& piece);
  // Pipeline parallelism: frees the frozen tensors of the units this stage never runs (held[u]
  // false), keeping those a held unit also reads (a tied head's embedding).
  void release_frozen_units(const std::vector<bool>& held);
  // The trainable parameters' names and full shapes (before tensor or pipeline parallelism keeps a
  // part), in parameters() order: describe(config()) without LoRA.
  std::vector<std::pair<std::string, std::vector<int64_t>>> full_shapes() const;
  // Every base tensor (HF names, HF order) with each adapter merged in: W + scaling * B A
  // (export --merge), and with the tensors trained in full taken from parameters().
  std::vector<std::pair<std::string, at::Tensor>> merged_tensors() const;

  // Copies `tensors` (HF names) into the parameters, converting dtype. Every parameter must be
  // present with its exact shape; `source` names the file in errors. Experts may come one tensor per
  // expert (as save_pretrained writes them) or fused (model/moe.h).
  void load(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& source);
  // Parameters as (HF name, detached tensor) in HF order, ready for safetensors.
  std::vector<std::pair<std::string, at::Tensor>> named_tensors() const;

 private:
  // router_logits: where a sparse layer leaves its router logits (output_router_logits), or null.
  at::Tensor decoder_layer(int64_t layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& segments, at::Tensor* router_logits = nullptr) const;
  // Parameter `index` as the forward reads it (through the regions' weight()).
  at::Tensor p(size_t index) const;
  // Base tensor `b` (describe()'s order): a parameter, or with LoRA maybe the frozen base's weight.
  at::Tensor base(size_t b) const;
  int64_t base_rows(size_t b) const;  // its size(0), without asking a quantized store for the weight
  // x W^T for layer `layer`'s weight in `slot`, plus its adapter's output when LoRA adapts it.
  // leaves: a row-parallel product (o_proj, down_proj) whose partial sums leave the parallel region
  // here (ParallelRegions::leave); its adapter's r-wide x A^T leaves with them and B applies after,
  // so tensor parallelism splits A by columns and keeps B whole.
  at::Tensor linear_slot(const at::Tensor& x, int64_t layer, int weight_slot, bool leaves = false) const;
  // Layer `layer`'s parameter in `slot` (layer_slots.h), or an undefined tensor when the family has
  // none there (a bias it lacks).
  at::Tensor slot(int64_t layer, int slot) const;
  // x W^T + b through model/fp32_products.h, the bias when the layer has one.
  at::Tensor projection(const at::Tensor& x, int64_t layer, int weight_slot) const;
  // A sparse layer's expert weight in `slot` as the experts compute with it: with an expert adapter
  // (lora.target_parameters) the frozen weight plus scaling * B_e A_e per expert (model/lora.h).
  at::Tensor expert_slot(int64_t layer, int slot) const;

  LlamaConfig cfg_;
  Attention attention_ = Attention::Eager;
  Recompute recompute_ = Recompute::None;
  std::vector<Parameter> params_;
  std::vector<Unit> units_;
  std::vector<std::vector<int>> layer_slots_;  // [layer][slot] -> index into params_, -1 when absent
  size_t final_norm_ = 0;                       // index of model.norm.weight
  // LoRA: per base tensor (describe()'s order) its parameter index or its index in frozen_ (-1:
  // not there); empty without LoRA, where base tensor b is parameter b.
  struct BaseRef {
    int param = -1, frozen = -1;
  };
  std::vector<BaseRef> base_refs_;
  std::vector<int64_t> frozen_rows_;
  std::shared_ptr<FrozenBase> frozen_;
  struct Adapter {
    size_t a = 0, b = 0;  // parameter indices of lora_A and lora_B
    double scaling = 0;
    int64_t experts = 0;  // > 0: on an expert parameter (model/lora.h, expert adapters)
  };
  std::vector<Adapter> adapters_;
  std::vector<std::vector<int>> adapter_slots_;  // [layer][slot] -> index into adapters_, -1 when none
  std::vector<std::pair<std::string, std::vector<int64_t>>> lora_shapes_;  // full_shapes() with LoRA
  LoraPlan lora_;
  std::shared_ptr<ParallelRegions> regions_;
  std::shared_ptr<ContextAttention> context_;
  ExpertCompute expert_compute_ = ExpertCompute::Grouped;
  std::shared_ptr<ExpertDispatch> expert_dispatch_;
  mutable std::vector<int64_t> expert_tokens_;
  // The forward's router logits (sparse layers, output_router_logits) and the loss they make.
  mutable std::vector<at::Tensor> router_logits_;
  mutable at::Tensor router_sums_before_, router_sums_;
  mutable at::Tensor aux_loss_;
  mutable at::Tensor aux_loss_sum_;
  mutable int64_t aux_loss_forwards_ = 0;
};

// Mean cross-entropy over all B*T positions: logits [B,T,V], targets int64 [B,T]; in float32
// (float64 for a float64 model), as HF upcasts logits before the loss.
at::Tensor cross_entropy_loss(const at::Tensor& logits, const at::Tensor& targets);
// Summed cross-entropy over the targets other than kIgnoredTarget (a scalar; 0 when none counts).
at::Tensor cross_entropy_loss_sum(const at::Tensor& logits, const at::Tensor& targets);

// HF RMSNorm: normalise in float32, cast back, then multiply by the weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace shardlm::model
