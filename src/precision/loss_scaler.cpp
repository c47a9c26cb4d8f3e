#include "precision/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace shardlm::precision {

LossScaler::LossScaler(LossScalerOptions options)
    : opt_(options),
      scale_(options.loss_scale > 0 ? options.loss_scale : std::ldexp(1.0, options.initial_scale_power)),
      hysteresis_left_(options.hysteresis) {}

bool LossScaler::at_floor() const {
  if (opt_.loss_scale > 0) return true;
  return scale_ <= opt_.min_loss_scale && hysteresis_left_ <= 1;
}

void LossScaler::update(bool overflow) {
  if (opt_.loss_scale > 0) return;
  if (overflow) {
    if (hysteresis_left_ <= 1) scale_ = std::max(scale_ / 2, opt_.min_loss_scale);
    else --hysteresis_left_;
    last_overflow_iteration_ = iteration_;
  } else if ((iteration_ - last_overflow_iteration_) % opt_.loss_scale_window == 0) {
    hysteresis_left_ = opt_.hysteresis;
    scale_ *= 2;
  }
  ++iteration_;
}

}  // namespace shardlm::precision
