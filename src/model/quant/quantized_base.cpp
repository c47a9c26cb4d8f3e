// See quantized_base.h.
#include "model/quant/quantized_base.h"

#include <ATen/ATen.h>

#include <regex>

#include "util/error.h"

namespace shardlm::model::quant {

bool quantized_by_bitsandbytes(const std::string& hf_name) {
  static const std::regex linear(R"(model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight)");
  return std::regex_match(hf_name, linear);
}

QuantizedFrozenBase::QuantizedFrozenBase(const std::vector<std::pair<std::string, at::Tensor>>& plain,
                                         const FourBitOptions& options)
    : options_(options) {
  at::NoGradGuard no_grad;
  entries_.reserve(plain.size());
  for (const auto& [name, t] : plain) {
    Entry e;
    e.name = name;
    if (quantized_by_bitsandbytes(name)) {
      if (t.dim() != 2) fail("quantization: ", name, " is not a matrix (", t.dim(), " dimensions)");
      e.q = quantize_4bit(t.detach(), options.type, options.double_quant);
    } else {
      e.plain = t.detach();
    }
    entries_.push_back(std::move(e));
  }
}

at::Tensor QuantizedFrozenBase::weight(size_t k) const {
  const auto& e = entries_[k];
  if (!e.q) return e.plain;
  // bitsandbytes' MatMul4Bit: dequantize_4bit(B, quant_state).to(A.dtype).
  return dequantize_4bit(*e.q, e.q->dtype).to(options_.compute_dtype);
}

void QuantizedFrozenBase::release(size_t k) {
  auto& e = entries_[k];
  e.plain = at::empty({0}, e.q ? e.q->absmax.options().dtype(options_.compute_dtype) : e.plain.options());
  e.q.reset();
}

int64_t QuantizedFrozenBase::bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.q ? e.q->bytes() : e.plain.numel() * static_cast<int64_t>(e.plain.element_size());
  return n;
}

int64_t QuantizedFrozenBase::quantized_bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_)
    if (e.q) n += e.q->bytes();
  return n;
}

int64_t QuantizedFrozenBase::quantized_bf16_bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_)
    if (e.q) n += 2 * e.q->numel();
  return n;
}

void QuantizedFrozenBase::to(at::Device device, at::ScalarType dtype) {
  options_.compute_dtype = dtype;
  for (auto& e : entries_) {
    if (!e.q) {
      e.plain = e.plain.is_floating_point() ? e.plain.to(device, dtype) : e.plain.to(device);
      continue;
    }
    e.q->packed = e.q->packed.to(device);
    e.q->absmax = e.q->absmax.to(device);
    if (e.q->absmax2.defined()) e.q->absmax2 = e.q->absmax2.to(device);
  }
}

std::shared_ptr<QuantizedFrozenBase> quantize_frozen_base(const FrozenBase& base, const FourBitOptions& options) {
  std::vector<std::pair<std::string, at::Tensor>> plain;
  plain.reserve(base.size());
  for (size_t k = 0; k < base.size(); ++k) plain.emplace_back(base.name(k), base.weight(k));
  return std::make_shared<QuantizedFrozenBase>(plain, options);
}

}  // namespace shardlm::model::quant
