// LoRA adapters (PEFT's LoraConfig, Hu et al. 2021) on a Llama whose base weights are frozen.
//
// What the model computes for a targeted linear W (PEFT's lora.Linear.forward, dropout on the
// adapter's input):   y = x W^T + dropout(x) A^T B^T * scaling,   scaling = alpha / r
// (alpha / sqrt(r) with use_rslora). A is [r, in], B is [out, r].
//
// Llama::apply_lora (model/llama.h) moves every base tensor out of Llama::parameters() into a
// FrozenBase, so strategies (DDP, ZeRO, checkpoints) see only the trainable tensors: the adapters
// and the modules_to_save (embedding / head trained in full). The forward asks the FrozenBase for a
// frozen weight each time it needs it, in forward and again in backward (frozen_linear below saves
// no weight), and computes no gradient for it.
//
// For QLoRA (the `quantization` section): subclass FrozenBase with a store whose weight(k) returns
// the dequantized compute-dtype tensor, build it from Llama::frozen_base() (PlainFrozenBase::tensors
// gives the plain tensors and their names) and install it with Llama::set_frozen_base. Nothing else
// of the model changes.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/lora_options.h"

namespace shardlm::model {

struct LlamaConfig;

// One adapted linear.
struct LoraTarget {
  int64_t layer = 0;
  std::string module;  // "self_attn.q_proj", "mlp.down_proj"
  int64_t r = 0;
  double alpha = 0;
  double scaling = 0;
  // > 0: an expert parameter (PEFT's target_parameters, a lora.ParamWrapper): `module` is the 3-D
  // weight ("mlp.experts.gate_up_proj", [E, out, in]) of this many experts, and its adapters are
  // adapter_module + ".lora_A.weight" [r * E, in] and ".lora_B.weight" [out, r * E].
  int64_t experts = 0;
  // Where PEFT keeps the adapters: the module itself for a linear; for the second of two expert
  // parameters of one module the wrappers nest, so the first gets "mlp.experts.base_layer".
  std::string adapter_module;
};

// A target's base weight name ("model.layers.0.self_attn.q_proj.weight",
// "model.layers.0.mlp.experts.gate_up_proj") and its adapters' prefix ("model.layers.0.mlp.experts").
std::string lora_base_name(const LoraTarget& t);
std::string lora_adapter_prefix(const LoraTarget& t);
// lora_A's and lora_B's shapes for a target whose base weight has `base_shape`.
std::pair<std::vector<int64_t>, std::vector<int64_t>> lora_pair_shapes(const LoraTarget& t,
                                                                        const std::vector<int64_t>& base_shape);

// The adapters the options give for this model: targets in parameter order, and the HF names of
// the tensors trained in full ("lm_head.weight", "model.embed_tokens.weight"). Refuses (naming the
// key) targets that match nothing, r <= 0, and what PEFT would refuse.
struct LoraPlan {
  std::vector<LoraTarget> targets;
  std::vector<std::string> trained_in_full;
  double dropout = 0;
  std::string init = "true";
};
LoraPlan resolve_lora(const LoraOptions& options, const LlamaConfig& cfg);
// PEFT's default target modules for a model type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
std::vector<std::string> default_lora_targets(const std::string& model_type);
// The linear modules of layer `layer` ("self_attn.q_proj", ...), in parameter order.
std::vector<std::string> layer_linear_modules(const LlamaConfig& cfg, int64_t layer);

// The frozen base weights, by index k in Llama::frozen_names() order (HF names).
class FrozenBase {
 public:
  virtual ~FrozenBase() = default;
  virtual size_t size() const = 0;
  virtual const std::string& name(size_t k) const = 0;
  // Weight k as the forward uses it: the compute dtype, its full shape, no gradient. Called once
  // per use in forward and again in backward for a linear (not kept between them).
  virtual at::Tensor weight(size_t k) const = 0;
  // Bytes held (the planner and memory.json).
  virtual int64_t bytes() const = 0;
  // Moves the store to `device` with its floating-point tensors in `dtype` (the compute dtype).
  virtual void to(at::Device device, at::ScalarType dtype) = 0;
  // Frees weight k (a pipeline stage that never runs its layer); weight(k) is then an empty tensor.
  virtual void release(size_t k) = 0;
};

// The base in its own dtype: plain tensors without gradient.
class PlainFrozenBase : public FrozenBase {
 public:
  explicit PlainFrozenBase(std::vector<std::pair<std::string, at::Tensor>> tensors);
  size_t size() const override { return tensors_.size(); }
  const std::string& name(size_t k) const override { return tensors_[k].first; }
  at::Tensor weight(size_t k) const override { return tensors_[k].second; }
  int64_t bytes() const override;
  void to(at::Device device, at::ScalarType dtype) override;
  void release(size_t k) override { tensors_[k].second = at::empty({0}, tensors_[k].second.options()); }
  const std::vector<std::pair<std::string, at::Tensor>>& tensors() const { return tensors_; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

// x W_k^T with W_k = base.weight(k): no gradient for W; backward asks base.weight(k) again for dX.
at::Tensor frozen_linear(const at::Tensor& x, std::shared_ptr<const FrozenBase> base, size_t k);

// The adapter's output: dropout(x) A^T B^T * scaling (dropout only in a training forward:
// model/recompute.h training_forward). lora_down is its first half, dropout(x) A^T (r wide): a
// row-parallel base's adapter (tensor parallelism) sums it over the ranks before B.
at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scaling, double dropout);
at::Tensor lora_down(const at::Tensor& x, const at::Tensor& a, double dropout);

// Fills A [r, in] and B [out, r] as PEFT's reset_lora_parameters does for `init`, from `gen`.
void init_lora_pair(at::Tensor& a, at::Tensor& b, const std::string& init, at::Generator& gen);
// The same for an adapter of rank r whose A has another row count (an expert parameter's [r * E, in]):
// "gaussian" draws A with std 1/r, as PEFT does.
void init_lora_pair_of_rank(at::Tensor& a, at::Tensor& b, const std::string& init, at::Generator& gen, int64_t r);

// Expert adapters (PEFT's lora.ParamWrapper on a 3-D weight W [E, out, in], peft 0.22.0): lora_A
// [r * E, in] holds expert e's A_e [r, in] in rows e*r..e*r+r-1; lora_B [out, r * E] holds its
// B_e [out, r] in columns j*E + e (PEFT's reshape(out, r, E)). The experts then compute with
//   W_e + scaling * B_e A_e
// (a parametrization: the whole weight, then the experts' products through it, so the gradient
// reaches A and B through the weight's). expert_lora_weight returns that weight (PEFT's baddbmm in the
// weight's dtype); expert_lora_delta the delta alone (merge). PEFT refuses dropout here: x cannot be factored out of the weight.
at::Tensor expert_lora_weight(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scaling);
at::Tensor expert_lora_delta(const at::Tensor& a, const at::Tensor& b, int64_t experts, double scaling);
// The experts' 3-D weights of layer `layer` that target_parameters can name ("mlp.experts.gate_up_proj",
// "mlp.experts.down_proj": PEFT's registration order), none for a dense layer.
std::vector<std::string> layer_expert_parameters(const LlamaConfig& cfg, int64_t layer);

}  // namespace shardlm::model
