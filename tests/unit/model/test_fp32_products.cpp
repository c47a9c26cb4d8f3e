// bf16 matrix products accumulate in fp32 on every processor: each product the model computes
// (forward x·wᵀ, attention q·kᵀ and p·v, and both gradients of each) differs from the exact
// product of the same bf16-rounded inputs by the output rounding alone, for k from 64 to 4096.
//
// The bound: rounding the exact result to bf16 (8 significant bits, unit roundoff u = 2^-9 for
// round-to-nearest) gives elementwise relative error <= 2^-9 = 1.95e-3, and norm-wise about
// 2^-9/sqrt(3) = 1.1e-3 for values spread over a binade; fp32 accumulation adds ~sqrt(k)·2^-24
// (< 1e-5 at k=4096). So 2.5e-3 norm-wise holds for output rounding and nothing else, while
// accumulating in bf16 (Debian libtorch 1.13 on AVX2: 1e-2 at k=64, 7e-2 at k=4096) fails it:
// the test computes that accumulation itself and checks the bound tells the two apart.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "model/fp32_products.h"
#include "../../support/worst_of.h"

using namespace shardlm;

namespace {

constexpr double kOutputRoundingBound = 2.5e-3;

double rel_error(const at::Tensor& got, const at::Tensor& exact) {
  return ((got.to(at::kDouble) - exact).norm() / exact.norm()).item<double>();
}

// Inputs rounded to bf16 once; the "exact" results are fp64 products of those rounded values.
struct Case {
  at::Tensor a, b;  // a [m, k], b [n, k]: the linear layer's x and w
};
Case make_case(int64_t m, int64_t n, int64_t k, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {at::randn({m, k}, gen, at::kFloat).to(at::kBFloat16), at::randn({n, k}, gen, at::kFloat).to(at::kBFloat16)};
}

// Worst norm-wise error over the three GEMMs of a linear layer (y = x·wᵀ: the "nt" layout;
// dx = dy·w: "nn"; dw = dyᵀ·x: "tn") and the two of an attention product (a·b with b a transposed
// view, as q·kᵀ, and its gradients), all through model::linear / model::matmul.
double worst_error_for_k(int64_t k) {
  const int64_t m = 96, n = 80;
  auto c = make_case(m, n, k, 1000 + k);
  auto x = c.a.clone().set_requires_grad(true), w = c.b.clone().set_requires_grad(true);
  auto y = model::linear(x, w);
  auto gen = at::detail::createCPUGenerator(7 + k);
  const auto dy = at::randn({m, n}, gen, at::kFloat).to(at::kBFloat16);
  y.backward(dy);
  const auto xd = c.a.to(at::kDouble), wd = c.b.to(at::kDouble), dyd = dy.to(at::kDouble);
  double worst = test_support::worst_of({rel_error(y, at::mm(xd, wd.t())),          // nt
                                         rel_error(x.grad(), at::mm(dyd, wd)),       // nn
                                         rel_error(w.grad(), at::mm(dyd.t(), xd))});  // tn
  // Attention-style batched product with a transposed operand: [2, m, k] x [2, k, n].
  auto q = c.a.unsqueeze(0).repeat({2, 1, 1}).set_requires_grad(true);
  auto kk = c.b.unsqueeze(0).repeat({2, 1, 1}).set_requires_grad(true);
  auto s = model::matmul(q, kk.transpose(1, 2));
  const auto ds = dy.unsqueeze(0).repeat({2, 1, 1});
  s.backward(ds);
  const auto qd = q.detach().to(at::kDouble), kd = kk.detach().to(at::kDouble), dsd = ds.to(at::kDouble);
  worst = test_support::worst_of({worst, rel_error(s, at::matmul(qd, kd.transpose(1, 2))),
                                  rel_error(q.grad(), at::matmul(dsd, kd)),
                                  rel_error(kk.grad(), at::matmul(dsd.transpose(1, 2), qd))});
  return worst;
}

// What a GEMM that accumulates in bf16 produces: each partial sum rounded to bf16.
double bf16_accumulation_error(int64_t k) {
  auto c = make_case(16, 16, k, 1000 + k);
  auto acc = at::zeros({16, 16}, at::kBFloat16);
  const auto a = c.a.to(at::kFloat), b = c.b.to(at::kFloat);
  for (int64_t i = 0; i < k; ++i)
    acc = (acc.to(at::kFloat) + at::outer(a.select(1, i), b.select(1, i)).to(at::kBFloat16).to(at::kFloat))
              .to(at::kBFloat16);
  return rel_error(acc, at::mm(c.a.to(at::kDouble), c.b.to(at::kDouble).t()));
}

struct ModeGuard {  // restores the process-wide policy after a test changes it
  ~ModeGuard() { model::set_bf16_products(model::Bf16Products::kAuto); }
};

}  // namespace

TEST(Fp32Products, Bf16GemmErrorIsOutputRoundingOnlyForEveryLayoutAndK) {
  ModeGuard guard;
  std::printf("[ gemm     ] %s\n", model::describe_bf16_products().c_str());
  for (const auto mode : {model::Bf16Products::kAuto, model::Bf16Products::kFp32, model::Bf16Products::kNative}) {
    model::set_bf16_products(mode);
    const char* name = mode == model::Bf16Products::kAuto ? "auto" : mode == model::Bf16Products::kFp32 ? "fp32" : "native";
    for (int64_t k : {64, 160, 1024, 4096}) {
      const double err = worst_error_for_k(k);
      std::printf("[ gemm     ] bf16 products (%s), k=%4lld: worst norm-wise error %.2e over nt/nn/tn and batched\n",
                  name, static_cast<long long>(k), err);
      EXPECT_LE(err, kOutputRoundingBound) << name << " k=" << k;
    }
  }
}

TEST(Fp32Products, TheBoundSeparatesBf16Accumulation) {
  for (int64_t k : {64, 1024}) {
    const double err = bf16_accumulation_error(k);
    std::printf("[ gemm     ] bf16 accumulation (simulated), k=%4lld: %.2e\n", static_cast<long long>(k), err);
    EXPECT_GT(err, 2 * kOutputRoundingBound) << "k=" << k;
  }
}

TEST(Fp32Products, Fp32ModeGivesTheSameGradientsAsAnFp32ComputationRoundedOnce) {
  ModeGuard guard;
  model::set_bf16_products(model::Bf16Products::kFp32);
  auto c = make_case(8, 6, 32, 3);
  auto x = c.a.clone().set_requires_grad(true), w = c.b.clone().set_requires_grad(true);
  const auto y = model::linear(x, w);
  y.sum().backward();
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  const auto xf = c.a.to(at::kFloat), wf = c.b.to(at::kFloat);
  EXPECT_TRUE(at::equal(y, at::mm(xf, wf.t()).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(x.grad(), at::mm(at::ones({8, 6}), wf).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(w.grad(), at::mm(at::ones({6, 8}), xf).to(at::kBFloat16)));
}

TEST(Fp32Products, ParsesTheConfigValuesAndRefusesOthers) {
  EXPECT_EQ(model::parse_bf16_products("auto"), model::Bf16Products::kAuto);
  EXPECT_EQ(model::parse_bf16_products("fp32"), model::Bf16Products::kFp32);
  EXPECT_EQ(model::parse_bf16_products("native"), model::Bf16Products::kNative);
  EXPECT_THROW(model::parse_bf16_products("bf16"), std::exception);
}
