// Loss scaling for fp16 training, with DeepSpeed's DynamicLossScaler semantics: start at
// 2^initial_scale_power; on overflow, skip the step and halve the scale once `hysteresis`
// overflows have been absorbed; after `loss_scale_window` clean steps since the last overflow,
// double it; never go below min_loss_scale. A static scale (loss_scale > 0) never changes.
#pragma once
#include <cstdint>

namespace shardlm::precision {

struct LossScalerOptions {
  double loss_scale = 0;  // > 0: static scale; 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options);
  double scale() const { return scale_; }
  // True when an overflow now cannot be absorbed: the scale is at its floor (or static) and the
  // hysteresis is used up, so the caller must stop rather than skip steps forever.
  bool at_floor() const;
  // Records one optimizer step's outcome (overflow: the step was skipped) and adapts the scale.
  void update(bool overflow);
  // Everything update() reads, for checkpoints: a resumed run scales exactly as an uninterrupted one.
  struct State {
    double scale;
    int hysteresis_left;
    int64_t iteration, last_overflow_iteration;
  };
  State state() const { return {scale_, hysteresis_left_, iteration_, last_overflow_iteration_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    iteration_ = s.iteration;
    last_overflow_iteration_ = s.last_overflow_iteration;
  }

 private:
  LossScalerOptions opt_;
  double scale_;
  int hysteresis_left_;
  int64_t iteration_ = 0, last_overflow_iteration_ = -1;
};

}  // namespace shardlm::precision
