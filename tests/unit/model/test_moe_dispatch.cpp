// The seam expert parallelism uses in the sparse block (model/moe.h ExpertDispatch; the all_to_all
// dispatch is parallel/expert/expert_dispatch.h, proven over ranks in tests/mpi/
// test_expert_parallel.cpp): a dispatch gets every routed row sorted by expert with a count for
// every expert of the layer, and a dispatch that computes them here gives the block bit for bit,
// values and gradients; the per-expert counts the metrics read cover every assignment (kept or
// dropped by the capacity); and a product over zero rows stays in the autograd graph (a rank whose
// experts received nothing must still run the backward of the exchanges its peers run).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/llama_config.h"
#include "model/moe.h"

using namespace shardlm;

namespace {

model::LlamaConfig tiny_moe(const std::string& family, double capacity = 0) {
  nlohmann::json j = {{"model_type", family},  {"vocab_size", 64},       {"hidden_size", 32},
                      {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"num_experts_per_tok", 2}};
  if (family == "mixtral") {
    j["num_local_experts"] = 4;
  } else {
    j["num_experts"] = 4;
    j["moe_intermediate_size"] = 16;
    j["shared_expert_intermediate_size"] = 24;
  }
  auto cfg = model::hf_config_from_json(j, "test config");
  cfg.moe_capacity_factor = capacity;
  return cfg;
}

std::vector<at::Tensor> block_leaves(const model::LlamaConfig& cfg, int64_t N, model::MoeWeights& w, at::Tensor& x) {
  at::manual_seed(7);
  const int64_t H = cfg.hidden_size, I = cfg.expert_intermediate_size(), E = cfg.num_experts;
  auto r = [](std::vector<int64_t> shape, double scale) { return (at::randn(shape, at::kDouble) * scale).requires_grad_(); };
  x = r({N, H}, 1.0);
  w.router = r({E, H}, 0.3);
  w.gate_up = r({E, 2 * I, H}, 0.1);
  w.down = r({E, H, I}, 0.1);
  std::vector<at::Tensor> out = {x, w.router, w.gate_up, w.down};
  if (cfg.shared_expert_intermediate_size > 0) {
    const int64_t S = cfg.shared_expert_intermediate_size;
    w.shared_gate = r({S, H}, 0.1);
    w.shared_up = r({S, H}, 0.1);
    w.shared_down = r({H, S}, 0.1);
    w.shared_expert_gate = r({1, H}, 0.1);
    for (const auto& t : {w.shared_gate, w.shared_up, w.shared_down, w.shared_expert_gate}) out.push_back(t);
  }
  return out;
}

// Computes the rows here, as the block does, and records what it was given.
struct LocalDispatch : model::ExpertDispatch {
  std::vector<int64_t> counts;
  int64_t rows = 0, calls = 0;
  at::Tensor experts(const at::Tensor& r, const std::vector<int64_t>& c, const at::Tensor& gate_up,
                     const at::Tensor& down, int64_t) override {
    counts = c;
    rows = r.size(0);
    ++calls;
    return model::expert_products(r, c, gate_up, down);
  }
};

// d(loss)/d(each leaf), by backward into cleared .grad.
std::vector<at::Tensor> grads_of(const at::Tensor& loss, const std::vector<at::Tensor>& leaves) {
  for (const auto& t : leaves) t.mutable_grad() = at::Tensor();
  loss.backward();
  std::vector<at::Tensor> out;
  for (const auto& t : leaves) out.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return out;
}

}  // namespace

TEST(MoeDispatch, ADispatchComputingHereGivesTheBlockBitForBit) {
  for (const std::string family : {"mixtral", "qwen2_moe"}) {
    const auto cfg = tiny_moe(family);
    const int64_t N = 40;
    model::MoeWeights w;
    at::Tensor x;
    auto leaves = block_leaves(cfg, N, w, x);
    const auto probe = at::randn({N, cfg.hidden_size}, at::kDouble);
    std::vector<int64_t> plain_counts, counts;
    const auto plain = model::moe_block(x, w, cfg, 0, nullptr, model::ExpertCompute::Grouped, nullptr, &plain_counts);
    const auto plain_grads = grads_of((plain * probe).sum(), leaves);
    LocalDispatch d;
    const auto hooked = model::moe_block(x, w, cfg, 0, nullptr, model::ExpertCompute::Grouped, &d, &counts);
    const auto grads = grads_of((hooked * probe).sum(), leaves);
    EXPECT_EQ(d.calls, 1);
    EXPECT_TRUE(at::equal(plain, hooked)) << family;
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(at::equal(plain_grads[i], grads[i])) << family << " leaf " << i;
    // One count per expert of the layer, covering every (token, slot) assignment, as the metrics get them.
    ASSERT_EQ(static_cast<int64_t>(d.counts.size()), cfg.num_experts);
    int64_t total = 0;
    for (auto c : d.counts) total += c;
    EXPECT_EQ(total, N * cfg.num_experts_per_tok);
    EXPECT_EQ(d.rows, total);
    EXPECT_EQ(counts, plain_counts);
    ASSERT_EQ(static_cast<int64_t>(counts.size()), cfg.num_experts + 1);
    for (int64_t e = 0; e < cfg.num_experts; ++e) EXPECT_EQ(counts[e], d.counts[e]);
    EXPECT_EQ(counts.back(), 0) << "dropless: nothing dropped";
  }
}

// With a capacity factor the counts are what each expert kept (at most the capacity) and the last
// element what was dropped; together every assignment.
TEST(MoeDispatch, CountsSplitKeptAndDroppedAssignments) {
  const auto cfg = tiny_moe("mixtral", 0.5);
  const int64_t N = 40, k = cfg.num_experts_per_tok, E = cfg.num_experts;
  model::MoeWeights w;
  at::Tensor x;
  block_leaves(cfg, N, w, x);
  std::vector<int64_t> counts;
  LocalDispatch d;
  model::moe_block(x, w, cfg, 0, nullptr, model::ExpertCompute::Grouped, &d, &counts);
  const auto cap = static_cast<int64_t>(std::ceil(0.5 * N * k / E));
  int64_t kept = 0;
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_LE(counts[e], cap);
    kept += counts[e];
  }
  EXPECT_GT(counts.back(), 0);
  EXPECT_EQ(kept + counts.back(), N * k);
  EXPECT_EQ(d.rows, kept) << "dropped assignments are not dispatched";
}

TEST(MoeDispatch, AProductOverZeroRowsStaysInTheGraph) {
  const auto rows = at::zeros({0, 8}, at::kDouble).requires_grad_();
  const auto w = at::randn({2, 6, 8}, at::kDouble).requires_grad_();
  const auto offsets = at::zeros({2}, at::kInt);
  const auto y = model::grouped_linear(rows, w, offsets, {0, 0});
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 6}));
  ASSERT_TRUE(y.requires_grad());
  const auto g = grads_of(y.sum(), {rows, w});
  ASSERT_TRUE(g[0].defined() && g[1].defined()) << "backward reached neither input";
  EXPECT_EQ(g[0].sizes(), rows.sizes());
  EXPECT_TRUE(at::equal(g[1], at::zeros_like(w)));
}
