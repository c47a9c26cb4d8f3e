// See attention.h. The eager path is HF's modeling_llama eager_attention_forward, step by step.
#include "model/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "model/fp32_products.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

// [B, kv, T, D] -> [B, kv*n_rep, T, D], each key/value head repeated for its query group.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), kv = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, T, D}).reshape({B, kv * n_rep, T, D});
}

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& blocked) {
  const int64_t D = q.size(3);
  auto scores = model::matmul(q, k.transpose(2, 3)) * std::pow(static_cast<double>(D), -0.5);  // HF: * head_dim**-0.5
  scores = scores.masked_fill(blocked, -std::numeric_limits<float>::infinity());
  // HF upcasts the softmax to float32 (a float64 model stays in float64).
  const auto softmax_dtype = scores.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto probs = at::softmax(scores, -1, softmax_dtype).to(q.scalar_type());
  return model::matmul(probs, v);
}

}  // namespace

at::Tensor attention_blocked(int64_t T, int64_t window, const at::TensorOptions& on) {
  const auto ones = at::ones({T, T}, on.dtype(at::kBool));
  auto blocked = ones.triu(1);
  if (window > 0 && window < T) blocked = blocked.logical_or(ones.tril(-window));
  return blocked;
}

at::Tensor attention_blocked(const at::Tensor& segments, int64_t window, const at::TensorOptions& on) {
  const auto other_sample = segments.unsqueeze(2).ne(segments.unsqueeze(1)).unsqueeze(1);  // [B, 1, T, T]
  return attention_blocked(segments.size(1), window, on).logical_or(other_sample);
}

void parse_attention(const std::string& name) {
  if (name != "auto" && name != "sdpa" && name != "eager")
    fail("attn_implementation must be \"auto\", \"sdpa\" or \"eager\", got \"", name, "\"");
}

Attention resolve_attention(const std::string& name, bool cuda, at::ScalarType dtype) {
  parse_attention(name);
  if (name == "sdpa") return Attention::Sdpa;
  if (name == "eager") return Attention::Eager;
  if (cuda) return Attention::Sdpa;
  // CPU, measured on the 2-core AVX2 machine (one thread, forward + backward, B=8 H=6 D=64): the
  // fused kernel is 1.7x faster than eager in fp32 at T=256 and 4.0x at T=1024. In bf16 its
  // products run in the library's 16-bit GEMM, slow without AVX-512 BF16 (eager with fp32
  // products was 2.3x faster), and fp16 has no fast CPU path: those use eager.
  if (dtype == at::kHalf) return Attention::Eager;
  if (dtype == at::kBFloat16) return bf16_products_in_fp32() ? Attention::Eager : Attention::Sdpa;
  return Attention::Sdpa;
}

const char* attention_name(Attention a) { return a == Attention::Sdpa ? "sdpa" : "eager"; }
bool attention_is_fused(Attention a) { return a == Attention::Sdpa; }

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Attention impl,
                            int64_t window, const at::Tensor& segments) {
  const int64_t n_rep = q.size(1) / k.size(1), T = q.size(2);
  const double scale = std::pow(static_cast<double>(q.size(3)), -0.5);
  if (window >= T) window = 0;  // a window as long as the sequence is plain causal attention
  // A window or packed samples are an explicit mask for the fused kernel (true = may attend), which
  // then takes its memory-efficient path instead of flash.
  const auto mask = segments.defined() ? attention_blocked(segments, window, q.options()).logical_not()
                    : window > 0       ? attention_blocked(T, window, q.options()).logical_not()
                                       : at::Tensor();
  // CUDA's flash kernel reads grouped key/value heads itself (enable_gqa), so k and v are neither
  // copied to every head nor saved that way (llama-1b: 8x fewer k/v bytes). Elsewhere (the CPU
  // kernel, and fp32 on CUDA, whose kernels do not take grouped heads) they are repeated first.
  const bool grouped = impl == Attention::Sdpa && n_rep > 1 && q.is_cuda() && !mask.defined() &&
                       (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf);
  if (grouped)
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/true);
  const auto kr = repeat_kv(k, n_rep), vr = repeat_kv(v, n_rep);
  if (impl == Attention::Eager)
    return eager_attention(q, kr, vr, segments.defined() ? attention_blocked(segments, window, q.options())
                                                         : attention_blocked(T, window, q.options()));
  const auto attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  return at::scaled_dot_product_attention(q, kr, vr, attn_mask, /*dropout_p=*/0.0, /*is_causal=*/!mask.defined(), scale);
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Attention impl,
                            const at::Tensor& blocked) {
  const int64_t n_rep = q.size(1) / k.size(1);
  const auto kr = repeat_kv(k, n_rep), vr = repeat_kv(v, n_rep);
  if (impl == Attention::Eager) return eager_attention(q, kr, vr, blocked);
  const double scale = std::pow(static_cast<double>(q.size(3)), -0.5);
  return at::scaled_dot_product_attention(q, kr, vr, blocked.logical_not(), /*dropout_p=*/0.0, /*is_causal=*/false,
                                          scale);
}

}  // namespace shardlm::model
