// What the ZeRO suites (test_zero.cpp, test_zero_memory.cpp) share: the tiny model's config at a
// ZeRO stage and precision, one training run's outcome (history, saved weights, memory.json), and
// the comparison of two outcomes within relative bounds.
#pragma once
#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "observe/metrics.h"
#include "train/config.h"

namespace shardlm::zero_test {

// configs/tiny.json at `stage` and `precision` (fp64, fp32, bf16, fp16), 2 micro-steps of 2, clipping
// 0.5, every stage-3 unit sharded; out_dir named by `tag`; lr 0: the config's.
train::TrainConfig config(int stage, const std::string& precision, const std::string& tag, int steps = 10,
                          double lr = 0);

struct Outcome {
  std::vector<observe::StepMetrics> history;
  std::vector<std::pair<std::string, at::Tensor>> weights;  // rank 0 only
  nlohmann::json memory;                                     // rank 0 only
};

Outcome run_training(const train::TrainConfig& cfg);

struct Tolerance {
  double loss, grad_norm, weights;  // relative; per step for loss and grad norm, in norm for weights
};

// On rank 0: `got` follows `ref` within `tol`, and `ref` learns.
void expect_same(const Outcome& got, const Outcome& ref, Tolerance tol, const std::string& what);

}  // namespace shardlm::zero_test
