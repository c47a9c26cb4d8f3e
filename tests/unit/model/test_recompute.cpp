// Activation checkpointing recomputes with the same kernels on the same inputs, so the logits, the
// loss and every parameter gradient must equal those of a run that kept everything, bit for bit;
// and it must keep less: the allocator's bytes in use after forward are measured for each mode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "model/recompute.h"
#include "util/error.h"
#include "util/process_memory.h"

using namespace shardlm;

namespace {

struct RecomputeRun {
  at::Tensor logits, loss;
  std::vector<at::Tensor> grads;
  int64_t held_after_forward = 0;
};

RecomputeRun run(model::Recompute mode, model::Attention attention) {
  auto cfg = model::preset("tiny");
  model::Llama llama(cfg, /*seed=*/5);
  llama.set_attention(attention);
  llama.set_recompute(mode);
  auto gen = at::detail::createCPUGenerator(3);
  const auto ids = at::randint(cfg.vocab_size, {4, 96}, gen, at::kLong);
  RecomputeRun r;
  const int64_t before = heap_in_use_bytes();
  r.logits = llama.forward(ids);
  r.loss = model::cross_entropy_loss(r.logits, ids);
  r.held_after_forward = heap_in_use_bytes() - before;
  r.loss.backward();
  for (const auto& p : llama.parameters()) r.grads.push_back(p.tensor.grad());
  return r;
}

}  // namespace

TEST(Recompute, FullAndSelectiveGiveBitIdenticalGradientsAndKeepLess) {
  for (auto attention : {model::Attention::Eager, model::Attention::Sdpa}) {
    const auto none = run(model::Recompute::None, attention);
    for (auto mode : {model::Recompute::Full, model::Recompute::Selective}) {
      const auto r = run(mode, attention);
      const std::string what = std::string(model::recompute_name(mode)) + " / " + model::attention_name(attention);
      EXPECT_TRUE(at::equal(r.logits, none.logits)) << what;
      EXPECT_TRUE(at::equal(r.loss, none.loss)) << what;
      ASSERT_EQ(r.grads.size(), none.grads.size());
      for (size_t i = 0; i < r.grads.size(); ++i) {
        ASSERT_TRUE(r.grads[i].defined()) << what << ": parameter " << i << " got no gradient";
        EXPECT_TRUE(at::equal(r.grads[i], none.grads[i])) << what << ": gradient of parameter " << i;
      }
      std::printf("[ recompute] %s: held after forward %.2f MB (none: %.2f MB)\n", what.c_str(),
                  r.held_after_forward / 1e6, none.held_after_forward / 1e6);
      // Full keeps one hidden-size tensor per layer; selective drops eager attention's T x T
      // probabilities (a fused kernel keeps none, so there it saves only the repeated k, v).
      if (mode == model::Recompute::Full || attention == model::Attention::Eager)
        EXPECT_LT(r.held_after_forward, none.held_after_forward * 0.8) << what;
      else
        EXPECT_LT(r.held_after_forward, none.held_after_forward) << what;
    }
  }
}

TEST(Recompute, ParsesTheModesAndRefusesOthers) {
  EXPECT_EQ(model::parse_recompute("none"), model::Recompute::None);
  EXPECT_EQ(model::parse_recompute("full"), model::Recompute::Full);
  EXPECT_EQ(model::parse_recompute("selective"), model::Recompute::Selective);
  try {
    model::parse_recompute("partial");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation_checkpointing.mode"), std::string::npos);
  }
}
