// Loss scaling as one object the trainer drives the same way in every precision (Megatron's
// grad_scaler.py is the model): the loss is multiplied by loss_scale() before backward; after the
// gradients are complete, update() reads the units' gradient statistics, agrees whether the step
// goes ahead and adapts the scale(s). Without fp16 it scales by 1, never reads the statistics and
// always steps, so the trainer needs no branch on the precision.
//
// fp16, one scale: DeepSpeed's dynamic loss scaler (loss_scaler.h). Per-unit scales
// (per_unit_loss_scaling) are set from each unit's own gradients instead of by probing: after a
// clean step unit u gets the power of two that puts its largest gradient near 2^12 (16x below
// fp16's maximum, headroom for the activations' gradients), between min_loss_scale and
// max_loss_scale; a unit whose gradients all underflowed to zero multiplies its scale by 16. On
// overflow only the highest overflowed unit halves: an inf flows down into every unit below it in
// backward, so those learned nothing about their own scale. At the floor an overflow stops the run.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "precision/loss_scaler.h"

namespace shardlm::precision {

// DeepSpeed's fp16 section, the training config's `fp16` (src/train/keys/precision_parallelism.cpp
// binds these fields): the dynamic scaler's settings (its base), the switch and per-unit scales.
struct GradScalerOptions : LossScalerOptions {
  bool enabled = false;                // fp16
  bool per_unit_loss_scaling = false;  // one scale per unit instead of one dynamic scale
  double max_loss_scale = 16777216;    // 2^24: per-unit scales' ceiling
  // For a non-finite loss's message: why loss scaling may be the cause and what to change ("" when
  // the loss is not scaled).
  std::string nonfinite_cause() const;
};

// One unit's gradients after they are complete (every rank sees the same values).
struct UnitGradient {
  bool overflow = false;
  double max_abs = 0;  // largest |gradient|, unscaled
};

class GradScaler {
 public:
  GradScaler() = default;
  GradScaler(GradScalerOptions options, size_t units);

  // What the loss is multiplied by before backward (per-unit: the head's scale, the last unit's).
  double loss_scale() const;
  // Per-unit scaling's scales, for the strategy that unscales each unit (empty otherwise).
  const std::vector<double>& unit_scales() const { return unit_scales_; }

  struct Verdict {
    bool step = true;         // false: the gradients overflowed, skip the optimizer step
    std::string overflowed;   // the units that overflowed, for messages
  };
  // `stats` is called only when scaling (it may communicate). Fails naming the units when an
  // overflow cannot be absorbed (the scale at its floor).
  Verdict update(int64_t step, const std::function<std::vector<UnitGradient>()>& stats,
                 const std::vector<std::string>& unit_names);
  // The step's metrics (loss_scale, skipped, skipped_steps, loss_scale.<unit>); none without fp16.
  std::vector<std::pair<std::string, double>> metrics(const std::vector<std::string>& unit_names) const;

  // Everything update() reads, for checkpoints: a resumed run scales exactly as an uninterrupted one.
  struct State {
    int64_t skipped_steps = 0;
    std::vector<double> unit_scales;
    std::optional<LossScaler::State> dynamic;
  };
  State state() const;
  // Restores what `s` holds that this run uses (unit scales only when their number matches).
  void restore(const State& s);
  // The state as a checkpoint's metadata keys: skipped_steps, unit_loss_scales and, with a dynamic
  // scaler, loss_scaler {scale, hysteresis_left, iteration, last_overflow_iteration}; and back from
  // a checkpoint's metadata (keys absent in an older checkpoint read as a fresh scaler's).
  nlohmann::json state_json() const;
  void restore_json(const nlohmann::json& meta);

 private:
  GradScalerOptions opt_;
  std::optional<LossScaler> dynamic_;
  std::vector<double> unit_scales_;
  int64_t skipped_steps_ = 0;
  bool last_skipped_ = false;
};

}  // namespace shardlm::precision
