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
};

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

}  // namespace shardlm::model
