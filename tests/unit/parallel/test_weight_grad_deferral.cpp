// The per-linear weight-gradient split (model/weight_grad_deferral.h) that zb_h1's B and W run on:
// against a whole autograd backward of the same stage-like graph (norm, linears, a bias, a weight
// used by two products, one of them on a transposed input, an embedding), B gives the stage input
// the same gradient bit for bit and leaves every .grad untouched with no gradient hook fired; W then
// leaves every .grad bit-identical (fp64, fp32, bf16 through fp32 products, and with the block
// recomputed in B: activation checkpointing), across
// micro-batches recorded and back-propagated out of order, and fires each parameter's
// gradient-ready hook (parallel/grad_ready_hook.h: DDP buckets, ZeRO reduce-scatters) exactly once
// per micro-batch, in the order the whole backward fires them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/fp32_products.h"
#include "model/llama.h"
#include "model/recompute.h"
#include "model/weight_grad_deferral.h"
#include "parallel/grad_ready_hook.h"

using namespace shardlm;

namespace {

struct Stage {
  // embedding, norm weight, two linear weights, a bias
  at::Tensor emb, norm, w1, w2, bias;
  std::vector<at::Tensor> params() const { return {emb, norm, w1, w2, bias}; }
  std::vector<std::string> names() const { return {"emb", "norm", "w1", "w2", "bias"}; }
  std::vector<std::shared_ptr<void>> keep;
  std::vector<std::string> fired;  // hook firings, in order
  std::vector<int> ready_at_fire;  // at each firing: how many parameters hold a gradient already
  const model::WeightGradQueue* running = nullptr;  // the queue whose W runs
  std::vector<size_t> computed_at_fire;              // at each firing: its products computed so far
  bool recompute = false;          // everything after the embedding checkpointed (one region)
};

Stage make_stage(at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(7);
  auto leaf = [&](std::vector<int64_t> shape) {
    return at::randn(shape, gen, at::kDouble).to(dtype).set_requires_grad(true);
  };
  Stage s{leaf({11, 8}), leaf({8}), leaf({16, 8}), leaf({8, 16}), leaf({8}), {}, {}};
  return s;
}

void hook(Stage& s) {
  const auto names = s.names();
  const auto params = s.params();
  for (size_t k = 0; k < params.size(); ++k)
    parallel::on_gradient_ready(params[k], [&s, name = names[k]] {
      s.fired.push_back(name);
      int ready = 0;
      for (const auto& p : s.params()) ready += p.grad().defined() ? 1 : 0;
      s.ready_at_fire.push_back(ready);
      if (s.running) s.computed_at_fire.push_back(s.running->products_computed());
    }, s.keep);
}

// One micro-batch through the stage: `in` (hidden states [2, 5, 8], or undefined on the first stage:
// the embedding of `tokens`) -> norm -> linear w1 -> silu -> linear w2 + bias + residual -> linear w1
// again on the transposed (non-contiguous) result: [5, 2, 16].
at::Tensor forward(const Stage& s, const at::Tensor& in, const at::Tensor& tokens) {
  const auto h = in.defined() ? in : s.emb.index_select(0, tokens.reshape({-1})).view({2, 5, 8});
  const model::Region block = [&s](const std::vector<at::Tensor>& x) {
    const auto n = x[0] * at::rsqrt(x[0].pow(2).mean({-1}, true) + 1e-6) * s.norm;
    const auto y = model::linear(at::silu(model::linear(n, s.w1)), s.w2) + s.bias + x[0];
    return model::linear(y.transpose(0, 1), s.w1);
  };
  return s.recompute ? model::recomputed(block, {h}) : block({h});
}

struct Micro {
  at::Tensor in, tokens, grad;  // grad undefined: the output is reduced to a scalar loss
};

std::vector<Micro> micro_batches(at::ScalarType dtype, bool first, bool last, int count) {
  auto gen = at::detail::createCPUGenerator(11);
  std::vector<Micro> out;
  for (int m = 0; m < count; ++m) {
    Micro mb;
    mb.tokens = at::randint(0, 11, {2, 5}, gen, at::kLong);
    if (!first) mb.in = at::randn({2, 5, 8}, gen, at::kDouble).to(dtype);
    if (!last) mb.grad = at::randn({5, 2, 16}, gen, at::kDouble).to(dtype);
    out.push_back(mb);
  }
  return out;
}

at::Tensor output(const Stage& s, at::Tensor& in, const Micro& mb) {
  if (mb.in.defined()) in = mb.in.clone().set_requires_grad(true);
  const auto out = forward(s, in, mb.tokens);
  return mb.grad.defined() ? out : (out * out).sum();
}

void expect_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].defined(), b[k].defined()) << what << " " << k;
    if (!a[k].defined()) continue;
    EXPECT_TRUE(at::equal(a[k], b[k])) << what << " " << k << ": max |diff| "
                                       << (a[k] - b[k]).abs().max().item<double>();
  }
}

std::vector<at::Tensor> grads(const Stage& s) {
  std::vector<at::Tensor> g;
  for (const auto& p : s.params()) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return g;
}

// Whole backwards, micro-batch after micro-batch (1f1b), against F0 F1 .. B0 B1 .. W0 W1 ..
// (deferred W in micro-batch order, as zb_h1 runs them), both from the same weights.
void check(at::ScalarType dtype, bool first, bool last, int count, bool recompute = false) {
  const std::string what = std::string(c10::toString(dtype)) + (first ? " first" : "") + (last ? " last" : "") +
                           (recompute ? " recomputed" : "");
  const auto mbs = micro_batches(dtype, first, last, count);
  Stage whole = make_stage(dtype), split = make_stage(dtype);
  whole.recompute = split.recompute = recompute;
  hook(whole);
  hook(split);
  std::vector<at::Tensor> whole_dx, split_dx;
  std::vector<std::vector<std::string>> whole_fired;
  std::vector<int> whole_ready;  // micro-batch 0's
  for (const auto& mb : mbs) {
    at::Tensor in;
    const auto out = output(whole, in, mb);
    whole.fired.clear();
    whole.ready_at_fire.clear();
    if (mb.grad.defined()) out.backward(mb.grad);
    else out.backward();
    whole_fired.push_back(whole.fired);
    if (whole_fired.size() == 1) whole_ready = whole.ready_at_fire;
    if (in.defined()) whole_dx.push_back(in.grad());
  }
  std::vector<std::unique_ptr<model::WeightGradQueue>> queues;
  std::vector<at::Tensor> outs, ins(mbs.size());
  for (size_t m = 0; m < mbs.size(); ++m) {
    queues.push_back(std::make_unique<model::WeightGradQueue>());
    model::WeightGradQueue::Recording recording(*queues.back());
    outs.push_back(output(split, ins[m], mbs[m]));
  }
  for (size_t m = 0; m < mbs.size(); ++m) {
    const auto dx = queues[m]->backward_input(outs[m], mbs[m].grad, ins[m]);
    if (ins[m].defined()) split_dx.push_back(dx);
    else EXPECT_FALSE(dx.defined());
    // B touched no parameter: every gradient waits in the queue (3 products, norm, bias, embedding).
    EXPECT_EQ(queues[m]->size(), first ? 6u : 5u) << what;
    for (const auto& p : split.params()) EXPECT_FALSE(p.grad().defined()) << what;
    EXPECT_TRUE(split.fired.empty()) << what;
  }
  expect_bits(whole_dx, split_dx, what + " input gradient");
  for (size_t m = 0; m < mbs.size(); ++m) {
    split.fired.clear();
    split.ready_at_fire.clear();
    split.computed_at_fire.clear();
    split.running = queues[m].get();
    const size_t products = queues[m]->products();
    queues[m]->backward_weight();
    split.running = nullptr;
    EXPECT_EQ(queues[m]->size(), 0u);
    // Once per parameter that has a gradient, in the whole backward's order.
    EXPECT_EQ(split.fired, whole_fired[m]) << what << " micro-batch " << m;
    // The first micro-batch's hooks fire one by one as its gradients land (1, 2, ... parameters
    // holding one), not after all of W's products: buckets launch while W still computes.
    if (m != 0) continue;
    std::vector<int> one_by_one(split.fired.size());
    for (size_t k = 0; k < one_by_one.size(); ++k) one_by_one[k] = static_cast<int>(k) + 1;
    EXPECT_EQ(split.ready_at_fire, one_by_one) << what;
    EXPECT_EQ(whole_ready, one_by_one) << what;
    // and the first hook fires before W has computed all its products (w1's two are summed, so the
    // last one lands last): a bucket's reduction would overlap the rest.
    ASSERT_FALSE(split.computed_at_fire.empty());
    EXPECT_LT(split.computed_at_fire.front(), products) << what;
    EXPECT_EQ(split.computed_at_fire.back(), products) << what;
  }
  EXPECT_EQ(whole_fired[0].size(), first ? 5u : 4u) << what;  // the embedding only on the first stage
  expect_bits(grads(whole), grads(split), what + " parameter gradients");
}

}  // namespace

TEST(WeightGradDeferral, SplitBackwardEqualsWholeBackwardBitForBit) {
  for (auto dtype : {at::kDouble, at::kFloat})
    for (bool first : {false, true})
      for (bool last : {false, true}) check(dtype, first, last, 3);
}

// Activation checkpointing under the split: the recomputation runs in B, deferring its linears'
// products into the same queue (its nested backward queues its parameters' gradients).
TEST(WeightGradDeferral, RecomputedRegionsDeferInB) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    check(dtype, false, false, 2, /*recompute=*/true);
    check(dtype, true, true, 2, /*recompute=*/true);
  }
}

TEST(WeightGradDeferral, Bf16ProductsInFp32EqualWholeBackward) {
  model::set_bf16_products(model::Bf16Products::kFp32);
  check(at::kBFloat16, false, false, 2);
  check(at::kBFloat16, true, true, 2);
  model::set_bf16_products(model::Bf16Products::kAuto);
}

// The model's own linears go through the split: every projection of every layer and the head is a
// deferred product (7 per layer + 1), and the model's gradients come out bit-identical.
TEST(WeightGradDeferral, LlamaLinearsAreDeferred) {
  const auto cfg = model::preset("tiny");
  model::Llama whole(cfg, /*seed=*/5), split(cfg, /*seed=*/5);
  auto gen = at::detail::createCPUGenerator(3);
  const auto ids = at::randint(0, cfg.vocab_size, {1, 8}, gen, at::kLong);
  const auto targets = at::randint(0, cfg.vocab_size, {1, 8}, gen, at::kLong);
  whole.loss(whole.forward(ids), targets).backward();
  model::WeightGradQueue queue;
  at::Tensor loss;
  {
    model::WeightGradQueue::Recording recording(queue);
    loss = split.loss(split.forward(ids), targets);
  }
  queue.backward_input(loss, at::Tensor(), at::Tensor());
  EXPECT_EQ(queue.products(), static_cast<size_t>(7 * cfg.num_hidden_layers + 1));
  for (const auto& p : split.parameters()) EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
  queue.backward_weight();
  for (size_t k = 0; k < whole.parameters().size(); ++k)
    EXPECT_TRUE(at::equal(whole.parameters()[k].tensor.grad(), split.parameters()[k].tensor.grad()))
        << whole.parameters()[k].name;
}

// Outside a Recording (or under no_grad), linear is autograd's own product: nothing is queued.
TEST(WeightGradDeferral, OnlyARecordingDefers) {
  model::WeightGradQueue queue;
  auto w = at::randn({4, 3}, at::kDouble).set_requires_grad(true);
  auto x = at::randn({2, 3}, at::kDouble).set_requires_grad(true);
  EXPECT_EQ(model::WeightGradQueue::recording(), nullptr);
  model::linear(x, w).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  {
    model::WeightGradQueue::Recording recording(queue);
    EXPECT_EQ(model::WeightGradQueue::recording(), &queue);
    at::NoGradGuard no_grad;
    EXPECT_FALSE(model::linear(x, w).requires_grad());
  }
  EXPECT_EQ(model::WeightGradQueue::recording(), nullptr);
  EXPECT_EQ(queue.size(), 0u);
}
