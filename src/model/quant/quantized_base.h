// QLoRA's frozen base (the `quantization` section, transformers' BitsAndBytesConfig 4-bit keys): a
// model::FrozenBase (model/lora.h) whose decoder linears are kept in bitsandbytes' 4-bit form
// (four_bit.h) and dequantized each time the forward or the backward asks for one, one weight at a
// time; the frozen product (frozen_linear) saves the store and the index, never the dequantized
// weight, and computes no gradient for it.
//
// Which tensors, as transformers' replace_with_bnb_linear does for a Llama: every nn.Linear of the
// decoder layers (q/k/v/o_proj, gate/up/down_proj) becomes a bnb Linear4bit; the embedding, the
// norms and the output head keep their dtype. Linear4bit dequantizes to the dtype the weight had when
// it was quantized and casts that to bnb_4bit_compute_dtype (bitsandbytes' MatMul4Bit), which
// weight(k) repeats.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/lora.h"
#include "model/quant/four_bit.h"

namespace shardlm::model::quant {

struct FourBitOptions {
  FourBitType type = FourBitType::NF4;
  bool double_quant = false;
  at::ScalarType compute_dtype = at::kFloat;
};

// Whether transformers' bitsandbytes loading makes this HF tensor 4-bit: a decoder layer's linear weight.
bool quantized_by_bitsandbytes(const std::string& hf_name);

class QuantizedFrozenBase : public FrozenBase {
 public:
  QuantizedFrozenBase(const std::vector<std::pair<std::string, at::Tensor>>& plain, const FourBitOptions& options);
  size_t size() const override { return entries_.size(); }
  const std::string& name(size_t k) const override { return entries_[k].name; }
  at::Tensor weight(size_t k) const override;
  int64_t bytes() const override;
  // Moves the packed codes and absmax as they are; the plain tensors (and what weight(k) returns) take `dtype`.
  void to(at::Device device, at::ScalarType dtype) override;
  void release(size_t k) override;
  bool quantized(size_t k) const { return entries_[k].q.has_value(); }
  const FourBit& four_bit(size_t k) const { return *entries_[k].q; }
  at::ScalarType compute_dtype() const { return options_.compute_dtype; }  // what weight(k) dequantizes to
  // The 4-bit tensors' bytes, and what the same tensors take in bfloat16 (the bench's ratio).
  int64_t quantized_bytes() const;
  int64_t quantized_bf16_bytes() const;

 private:
  struct Entry {
    std::string name;
    at::Tensor plain;          // a tensor kept in its dtype (undefined when quantized)
    std::optional<FourBit> q;  // the 4-bit form of a decoder linear
  };
  std::vector<Entry> entries_;
  FourBitOptions options_;
};

// Replaces the frozen base of a model with LoRA adapters by its 4-bit form (Llama::set_frozen_base).
std::shared_ptr<QuantizedFrozenBase> quantize_frozen_base(const FrozenBase& base, const FourBitOptions& options);

}  // namespace shardlm::model::quant
