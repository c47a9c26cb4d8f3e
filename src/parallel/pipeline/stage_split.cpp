// See stage_split.h.
#include "parallel/pipeline/stage_split.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "util/error.h"

namespace shardlm::parallel::pp {

UnitCosts unit_costs(const model::LlamaConfig& m) {
  const double h = static_cast<double>(m.hidden_size), kv = static_cast<double>(m.num_key_value_heads * m.head_dim());
  const double q = static_cast<double>(m.num_attention_heads * m.head_dim());
  // A mixture of experts: a token's active products (top-k experts, the shared expert, the router),
  // every layer costed as a sparse one.
  const double mlp = m.is_moe() ? static_cast<double>(m.num_experts_per_tok * m.expert_intermediate_size() +
                                                      m.shared_expert_intermediate_size) +
                                      static_cast<double>(m.num_experts) / 3.0
                                : static_cast<double>(m.intermediate_size);
  const double vocab = static_cast<double>(m.vocab_size);
  UnitCosts c;
  c.embedding = h;  // a row copied (and, backward, added)
  // q and o (h x heads*head_dim), k and v (h x kv), gate, up and down (h x mlp): 2 flops per multiply-add.
  c.layer = 2 * (2 * h * q + 2 * h * kv + 3 * h * mlp);
  c.head = 2 * h * vocab + 5 * vocab;  // the vocabulary product, then softmax and cross-entropy
  return c;
}

std::vector<double> stage_costs(const std::vector<int64_t>& counts, const UnitCosts& costs) {
  std::vector<double> out;
  for (size_t s = 0; s < counts.size(); ++s)
    out.push_back(static_cast<double>(counts[s]) * costs.layer + (s == 0 ? costs.embedding : 0) +
                  (s + 1 == counts.size() ? costs.head : 0));
  return out;
}

namespace {

double max_cost(const std::vector<int64_t>& counts, const UnitCosts& costs) {
  const auto c = stage_costs(counts, costs);
  return *std::max_element(c.begin(), c.end());
}

// Even counts, the remainder (fewer than `stages` layers, one each) on the middle stages first.
std::vector<int64_t> even_counts(int64_t layers, int stages) {
  std::vector<int64_t> counts(stages, layers / stages);
  std::vector<int> order;
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (int64_t i = 0; i < layers % stages; ++i) counts[order[i]] += 1;
  return counts;
}

}  // namespace

std::vector<int64_t> balanced_layer_counts(int64_t layers, int stages, const UnitCosts& costs) {
  auto even = even_counts(layers, stages);
  // best[s][i]: the smallest largest-stage cost of layers [0, i) on stages [0, s]; from[s][i] the
  // first layer of stage s in that split. Stage s must hold at least one layer.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> from(stages, std::vector<int64_t>(layers + 1, 0));
  auto cost = [&](int s, int64_t n) {
    return static_cast<double>(n) * costs.layer + (s == 0 ? costs.embedding : 0) + (s == stages - 1 ? costs.head : 0);
  };
  for (int64_t i = 1; i <= layers; ++i) best[0][i] = cost(0, i);
  for (int s = 1; s < stages; ++s)
    for (int64_t i = s + 1; i <= layers; ++i)
      for (int64_t j = s; j < i; ++j) {
        const double c = std::max(best[s - 1][j], cost(s, i - j));
        if (c < best[s][i]) best[s][i] = c, from[s][i] = j;
      }
  // Equally balanced (to rounding): keep the even split.
  if (max_cost(even, costs) <= best[stages - 1][layers] * (1 + 1e-12)) return even;
  std::vector<int64_t> counts(stages);
  for (int s = stages - 1, i = static_cast<int>(layers); s >= 0; --s) {
    const int64_t j = s == 0 ? 0 : from[s][i];
    counts[s] = i - j;
    i = static_cast<int>(j);
  }
  return counts;
}

std::vector<int64_t> layer_counts(const model::LlamaConfig& model, int stages, const std::vector<int64_t>& split) {
  const int64_t layers = model.num_hidden_layers;
  if (stages < 1) fail("parallelism.pipeline_parallel must be >= 1, got ", stages);
  if (!split.empty()) {
    std::string list;
    for (auto c : split) list += (list.empty() ? "" : ", ") + std::to_string(c);
    const int64_t sum = std::accumulate(split.begin(), split.end(), int64_t{0});
    if (static_cast<int>(split.size()) != stages || sum != layers ||
        std::any_of(split.begin(), split.end(), [](int64_t c) { return c < 1; }))
      fail("parallelism.pipeline_split [", list, "] must hold ", stages, " layer counts (one per pipeline stage), each "
           ">= 1, summing to the model's ", layers, " layers; it has ", split.size(), " summing to ", sum);
    return split;
  }
  if (stages > layers)
    fail("parallelism.pipeline_parallel=", stages, " exceeds the model's ", layers,
         " decoder layers: every stage needs at least one; use at most ", layers, " stages");
  return balanced_layer_counts(layers, stages, unit_costs(model));
}


StageUnits stage_units(const std::vector<int64_t>& counts, int stage) {
  int64_t before = 0;
  for (int s = 0; s < stage; ++s) before += counts[s];
  const int64_t layers = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  StageUnits u;
  u.first = stage == 0 ? 0 : static_cast<size_t>(1 + before);
  u.last = stage == static_cast<int>(counts.size()) - 1 ? static_cast<size_t>(layers + 1)
                                                        : static_cast<size_t>(before + counts[stage]);
  return u;
}

}  // namespace shardlm::parallel::pp
