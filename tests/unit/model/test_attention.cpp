// The fused attention path (the library's scaled_dot_product_attention) against the eager
// transcription of HF's attention, which the golden parity tests pin to transformers: same
// logits, loss and gradients on the tiny GQA model, to rounding of the dtype compared in.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/attention.h"
#include "model/fp32_products.h"
#include "model/llama.h"
#include "util/error.h"
#include "../../support/worst_of.h"
#include "../../support/relative_difference.h"

using namespace shardlm;

namespace {

using test_support::relative_difference;

struct Run {
  at::Tensor logits, loss;
  std::vector<at::Tensor> grads;
};

Run run(model::Attention impl, at::ScalarType dtype, int64_t T, int64_t window = 0) {
  auto cfg = model::preset("tiny");
  if (window > 0) {  // Mistral's window on every layer
    cfg.model_type = "mistral";
    cfg.sliding_window = window;
  }
  model::Llama llama(cfg, /*seed=*/7, dtype);
  llama.set_attention(impl);
  auto gen = at::detail::createCPUGenerator(11);
  const auto ids = at::randint(cfg.vocab_size, {2, T}, gen, at::kLong);
  Run r;
  r.logits = llama.forward(ids);
  r.loss = model::cross_entropy_loss(r.logits, ids);
  r.loss.backward();
  for (const auto& p : llama.parameters()) r.grads.push_back(p.tensor.grad());
  return r;
}

void expect_same(model::Attention a, model::Attention b, at::ScalarType dtype, int64_t T, double tol,
                 int64_t window = 0) {
  const auto x = run(a, dtype, T, window), y = run(b, dtype, T, window);
  const double logits = relative_difference(x.logits, y.logits), loss = relative_difference(x.loss, y.loss);
  double grads = 0;
  for (size_t i = 0; i < x.grads.size(); ++i) grads = test_support::worst_of(grads, relative_difference(x.grads[i], y.grads[i]));
  std::printf("[ attention] %s T=%lld: logits %.2e, loss %.2e, worst gradient %.2e (bound %.0e)\n",
              c10::toString(dtype), static_cast<long long>(T), logits, loss, grads, tol);
  EXPECT_LE(logits, tol);
  EXPECT_LE(loss, tol);
  EXPECT_LE(grads, tol);
  EXPECT_GT(logits, 0.0) << "two different kernels agreeing bit for bit means one was not used";
}

}  // namespace

TEST(Attention, FusedMatchesEagerInFloat64) {
  expect_same(model::Attention::Sdpa, model::Attention::Eager, at::kDouble, 64, 1e-12);
}

// A sliding window shorter than the sequence: the fused kernel's explicit mask equals the eager
// path's band (which the family parity tests pin to transformers), and it changes the result.
TEST(Attention, FusedMatchesEagerWithASlidingWindow) {
  expect_same(model::Attention::Sdpa, model::Attention::Eager, at::kDouble, 64, 1e-12, /*window=*/9);
  EXPECT_GT(relative_difference(run(model::Attention::Sdpa, at::kDouble, 64, 9).logits, run(model::Attention::Sdpa, at::kDouble, 64).logits),
            1e-3);
  const auto blocked = model::attention_blocked(4, 2, at::TensorOptions());
  const auto want = at::tensor({0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0}, at::kLong).view({4, 4}).to(at::kBool);
  EXPECT_TRUE(at::equal(blocked, want)) << blocked;  // query i sees keys i-1 and i
}

TEST(Attention, FusedMatchesEagerInFloat32) {
  // fp32 rounding (2^-24 = 6e-8) accumulated over two layers and the vocab softmax.
  expect_same(model::Attention::Sdpa, model::Attention::Eager, at::kFloat, 64, 2e-6);
}

TEST(Attention, EagerIsTheDefault) {
  model::Llama llama(model::preset("tiny"), 1);
  EXPECT_EQ(llama.attention(), model::Attention::Eager);
}

TEST(Attention, AutoTakesTheFasterKernelPerDeviceAndDtype) {
  using model::Attention;
  EXPECT_EQ(model::resolve_attention("auto", /*cuda=*/true, at::kBFloat16), Attention::Sdpa);
  EXPECT_EQ(model::resolve_attention("auto", true, at::kFloat), Attention::Sdpa);
  EXPECT_EQ(model::resolve_attention("auto", false, at::kFloat), Attention::Sdpa);
  EXPECT_EQ(model::resolve_attention("auto", false, at::kHalf), Attention::Eager);
  EXPECT_EQ(model::resolve_attention("auto", false, at::kBFloat16),
            model::bf16_products_in_fp32() ? Attention::Eager : Attention::Sdpa);
  EXPECT_EQ(model::resolve_attention("eager", true, at::kBFloat16), Attention::Eager);
  EXPECT_EQ(model::resolve_attention("sdpa", false, at::kHalf), Attention::Sdpa);
  try {
    model::resolve_attention("flash", false, at::kFloat);
    FAIL() << "an unknown implementation must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"auto\", \"sdpa\" or \"eager\""), std::string::npos) << e.what();
  }
}
