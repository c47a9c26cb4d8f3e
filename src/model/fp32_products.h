// 16-bit matrix products whose accuracy and speed do not depend on the processor.
//
// A bf16 or fp16 GEMM on real 16-bit hardware multiplies 16-bit inputs, accumulates in fp32 and
// rounds the result once. On CPUs the library does that quickly only where the processor has bf16
// dot products (AVX-512 BF16 / AMX): elsewhere PyTorch 2.11 still accumulates in fp32 but through a
// scalar loop ~60x slower than fp32 (measured on an AVX2 EPYC), and Debian's 1.13 accumulated in
// bf16 (relative error 7e-2 at k=4096). fp16 GEMMs have no fast CPU path at all.
// So where the native path is not fast, `linear` and `matmul` here convert the 16-bit inputs to
// fp32, multiply, and round the product once to the 16-bit type — the same arithmetic as the
// hardware path up to summation order. Backward does the same for both input gradients. Only the
// 16-bit inputs are saved for backward (no fp32 copies held between forward and backward), so
// activation memory is that of the native path.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace shardlm::model {

// How bf16 products are computed on CPU tensors. fp16 products on CPU are always computed in fp32.
enum class Bf16Products {
  kAuto,    // native where the CPU has bf16 dot products and the ISA is not capped below them, else fp32
  kNative,  // the library's bf16 GEMM
  kFp32,    // fp32 products, rounded once
};
Bf16Products parse_bf16_products(const std::string& s);  // "auto" | "native" | "fp32"

// Process-wide setting, read by linear/matmul below (the trainer sets it once at start).
void set_bf16_products(Bf16Products mode);
// Whether bf16 products on this process's CPU tensors go through fp32, after resolving kAuto.
bool bf16_products_in_fp32();
// One line for logs and `--version`: which path bf16 products take here, and why.
std::string describe_bf16_products();

// x @ w^T (as at::linear, no bias) and a @ b (as at::matmul on equal batch shapes); fp32 products
// for 16-bit inputs where the policy above says so, the library's op otherwise.
// Under a WeightGradQueue::Recording (weight_grad_deferral.h) linear's weight product is deferred.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

}  // namespace shardlm::model
