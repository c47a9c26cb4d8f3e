// What a parity test compares: a run's step metrics and its final weights, against the same
// training by one process. Shared by the model-parallel and expert-parallel suites, which add their
// own per-step checks (verbose printing, the MoE routing counts below) through `per_step`.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "observe/metrics.h"
#include "../support/worst_of.h"

namespace shardlm::test_support {

struct Outcome {
  std::vector<observe::StepMetrics> history;
  std::vector<std::pair<std::string, at::Tensor>> weights;  // rank 0 only
};

// Worst relative deviations over the steps (loss, grad norm) and over the final tensors (norm-wise).
struct Deviation {
  double loss = 0, grad_norm = 0, weights = 0;
};

// `got` against `ref`: the same number of steps and the same tensor names and shapes (gtest
// expectations), and the worst deviations. per_step(i) runs for step i (0-based) of both.
inline Deviation deviation_of(const Outcome& got, const Outcome& ref, const std::function<void(size_t)>& per_step = {}) {
  Deviation d;
  EXPECT_EQ(got.history.size(), ref.history.size());
  for (size_t i = 0; i < std::min(got.history.size(), ref.history.size()); ++i) {
    if (per_step) per_step(i);
    d.loss = test_support::worst_of(d.loss, std::abs(got.history[i].loss - ref.history[i].loss) / ref.history[i].loss);
    d.grad_norm = test_support::worst_of(d.grad_norm, std::abs(got.history[i].grad_norm - ref.history[i].grad_norm) /
                                            ref.history[i].grad_norm);
  }
  EXPECT_EQ(got.weights.size(), ref.weights.size());
  for (size_t k = 0; k < std::min(got.weights.size(), ref.weights.size()); ++k) {
    EXPECT_EQ(got.weights[k].first, ref.weights[k].first);
    EXPECT_EQ(got.weights[k].second.sizes(), ref.weights[k].second.sizes()) << ref.weights[k].first;
    if (got.weights[k].second.sizes() != ref.weights[k].second.sizes()) continue;
    const auto a = got.weights[k].second.to(at::kDouble), b = ref.weights[k].second.to(at::kDouble);
    d.weights = test_support::worst_of(d.weights, ((a - b).norm() / b.norm()).item<double>());
  }
  return d;
}

// Mixture of experts: step i routed as one process did, i.e. every expert took as many assignments
// (summed over the ranks that route) and a capacity dropped as many (metrics.jsonl's moe_* keys).
// Returns how many such keys the reference has (0: a dense model).
inline int64_t expect_same_routing(const Outcome& got, const Outcome& ref, size_t i) {
  int64_t keys = 0;
  for (const auto& [key, value] : ref.history[i].extra)
    if (key.rfind("moe_", 0) == 0) {
      ++keys;
      EXPECT_EQ(got.history[i].extra.count(key) ? got.history[i].extra.at(key) : -1.0, value) << key << " step " << i + 1;
    }
  // The load-balancing loss's metric: the mean over the step's micro-batches of every rank, the
  // same set of micro-batches in both runs (to rounding).
  if (const auto it = ref.history[i].extra.find("router_aux_loss"); it != ref.history[i].extra.end()) {
    ++keys;
    const auto got_it = got.history[i].extra.find("router_aux_loss");
    EXPECT_TRUE(got_it != got.history[i].extra.end()) << "router_aux_loss missing at step " << i + 1;
    if (got_it != got.history[i].extra.end()) {
      EXPECT_NEAR(got_it->second, it->second, 1e-6 * std::max(1.0, std::abs(it->second))) << "router_aux_loss step " << i + 1;
    }
  }
  return keys;
}

}  // namespace shardlm::test_support
