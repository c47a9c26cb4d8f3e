#include "model/fp32_products.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "model/weight_grad_deferral.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<Bf16Products> g_mode{Bf16Products::kAuto};

// What PyTorch's CPU bf16 GEMM runs on: oneDNN, fast only with bf16 dot-product instructions. The
// environment variables that cap ATen's and oneDNN's instruction sets (used to make an AVX-512
// machine behave as an AVX2 one) count as the processor lacking them.
bool cpu_has_fast_bf16_gemm() {
  if (!__builtin_cpu_supports("avx512bf16")) return false;
  if (const char* aten = std::getenv("ATEN_CPU_CAPABILITY"))
    if (std::strcmp(aten, "avx2") == 0 || std::strcmp(aten, "default") == 0) return false;
  if (const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA")) {
    const std::string s(isa);
    const bool capped_below = s.find("BF16") == std::string::npos && s.find("AMX") == std::string::npos &&
                              s.find("FP16") == std::string::npos && s.find("AVX10") == std::string::npos &&
                              s != "ALL" && s != "DEFAULT";
    if (capped_below) return false;
  }
  return true;
}

bool products_in_fp32(const at::Tensor& t) {
  if (!t.is_cpu()) return false;
  if (t.scalar_type() == at::kHalf) return true;
  return t.scalar_type() == at::kBFloat16 && bf16_products_in_fp32();
}

at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// y = x @ w^T with x [..., in], w [out, in]: fp32 products, one rounding of each output.
// Backward: dx = dy @ w and dw = dy^T @ x, each in fp32 and rounded once to the input's type.
struct Fp32ProductLinear : torch::autograd::Function<Fp32ProductLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return at::linear(f32(x), f32(w)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto g = f32(grads[0]);
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = at::matmul(g, f32(w)).to(x.scalar_type());
    if (ctx->needs_input_grad(1))
      dw = at::mm(g.reshape({-1, w.size(0)}).t(), f32(x).reshape({-1, w.size(1)})).to(w.scalar_type());
    return {dx, dw};
  }
};

// c = a @ b over equal leading (batch) dimensions: fp32 products, one rounding.
// Backward: da = dc @ b^T and db = a^T @ dc, each in fp32 and rounded once.
struct Fp32ProductMatmul : torch::autograd::Function<Fp32ProductMatmul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return at::matmul(f32(a), f32(b)).to(a.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &b = saved[1];
    const auto g = f32(grads[0]);
    at::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = at::matmul(g, f32(b).transpose(-1, -2)).to(a.scalar_type());
    if (ctx->needs_input_grad(1)) db = at::matmul(f32(a).transpose(-1, -2), g).to(b.scalar_type());
    return {da, db};
  }
};

}  // namespace

Bf16Products parse_bf16_products(const std::string& s) {
  if (s == "auto") return Bf16Products::kAuto;
  if (s == "native") return Bf16Products::kNative;
  if (s == "fp32") return Bf16Products::kFp32;
  fail("bf16.cpu_products must be \"auto\", \"native\" or \"fp32\", got \"", s, "\"");
}

void set_bf16_products(Bf16Products mode) { g_mode = mode; }

bool bf16_products_in_fp32() {
  switch (g_mode.load()) {
    case Bf16Products::kNative: return false;
    case Bf16Products::kFp32: return true;
    case Bf16Products::kAuto: break;
  }
  static const bool fast = cpu_has_fast_bf16_gemm();
  return !fast;
}

std::string describe_bf16_products() {
  const bool fp32 = bf16_products_in_fp32();
  const char* why = g_mode.load() != Bf16Products::kAuto ? "as configured"
                    : fp32 ? "this CPU has no bf16 dot products (AVX-512 BF16)"
                           : "this CPU has bf16 dot products";
  return std::string("bf16 CPU products ") + (fp32 ? "in fp32, rounded once" : "native") + " (" + why + ")";
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  // Under a weight-gradient deferral (weight_grad_deferral.h: zero-bubble schedules' B and W), a
  // trainable weight's product waits for W; the products are the same as below.
  if (auto* queue = WeightGradQueue::recording();
      queue && at::GradMode::is_enabled() && w.is_leaf() && w.requires_grad() && x.requires_grad() && x.dim() >= 2)
    return linear_deferring_weight_grad(x, w, *queue, products_in_fp32(w));
  return products_in_fp32(w) ? Fp32ProductLinear::apply(x, w) : at::linear(x, w);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  return products_in_fp32(a) ? Fp32ProductMatmul::apply(a, b) : at::matmul(a, b);
}

}  // namespace shardlm::model
