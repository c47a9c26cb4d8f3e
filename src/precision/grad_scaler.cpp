// See grad_scaler.h.
#include "precision/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace shardlm::precision {

GradScaler::GradScaler(GradScalerOptions options, size_t units) : opt_(options) {
  if (!opt_.enabled) return;
  if (opt_.per_unit_loss_scaling) unit_scales_.assign(units, std::exp2(opt_.initial_scale_power));
  else dynamic_.emplace(static_cast<const LossScalerOptions&>(opt_));
}

double GradScaler::loss_scale() const {
  return !unit_scales_.empty() ? unit_scales_.back() : dynamic_ ? dynamic_->scale() : 1.0;
}

GradScaler::Verdict GradScaler::update(int64_t step, const std::function<std::vector<UnitGradient>()>& stats_of,
                                       const std::vector<std::string>& unit_names) {
  Verdict v;
  last_skipped_ = false;
  if (!opt_.enabled) return v;
  const auto stats = stats_of();
  std::vector<size_t> overflowed;
  for (size_t u = 0; u < stats.size(); ++u)
    if (stats[u].overflow) overflowed.push_back(u);
  for (size_t u : overflowed) v.overflowed += (v.overflowed.empty() ? "" : ", ") + unit_names[u];
  const bool per_unit = !unit_scales_.empty();
  if (!overflowed.empty()) {
    const size_t origin = overflowed.back();
    const bool stuck = per_unit ? unit_scales_[origin] <= opt_.min_loss_scale : dynamic_->at_floor();
    if (stuck)
      fail("fp16 gradients overflowed at step ", step, " in unit(s) ", v.overflowed, " with the loss scale at its floor (",
           per_unit ? unit_scales_[origin] : dynamic_->scale(), "); every further step would be skipped. Lower "
           "optimizer.params.lr, raise fp16.min_loss_scale, or train in bf16 (bf16.enabled)");
    if (per_unit) unit_scales_[origin] = std::max(opt_.min_loss_scale, unit_scales_[origin] / 2);
    else dynamic_->update(true);
    ++skipped_steps_;
    last_skipped_ = true;
    v.step = false;
  } else if (per_unit) {
    for (size_t u = 0; u < unit_scales_.size(); ++u) {
      double next = unit_scales_[u] * 16;
      if (stats[u].max_abs > 0) next = std::exp2(std::floor(std::log2(4096.0 / stats[u].max_abs)));
      unit_scales_[u] = std::clamp(next, opt_.min_loss_scale, opt_.max_loss_scale);
    }
  } else {
    dynamic_->update(false);
  }
  return v;
}

std::vector<std::pair<std::string, double>> GradScaler::metrics(const std::vector<std::string>& unit_names) const {
  if (!opt_.enabled) return {};
  std::vector<std::pair<std::string, double>> out = {{"skipped", last_skipped_ ? 1 : 0},
                                                     {"loss_scale", loss_scale()},
                                                     {"skipped_steps", static_cast<double>(skipped_steps_)}};
  for (size_t u = 0; u < unit_scales_.size(); ++u) out.emplace_back("loss_scale." + unit_names[u], unit_scales_[u]);
  return out;
}

GradScaler::State GradScaler::state() const {
  State s{skipped_steps_, unit_scales_, std::nullopt};
  if (dynamic_) s.dynamic = dynamic_->state();
  return s;
}

void GradScaler::restore(const State& s) {
  skipped_steps_ = s.skipped_steps;
  if (dynamic_ && s.dynamic) dynamic_->restore(*s.dynamic);
  if (!unit_scales_.empty() && s.unit_scales.size() == unit_scales_.size()) unit_scales_ = s.unit_scales;
}

nlohmann::json GradScaler::state_json() const {
  const State st = state();
  nlohmann::json j = {{"skipped_steps", st.skipped_steps}, {"unit_loss_scales", st.unit_scales}};
  if (st.dynamic) {
    j["loss_scaler"] = {{"scale", st.dynamic->scale}, {"hysteresis_left", st.dynamic->hysteresis_left},
                        {"iteration", st.dynamic->iteration},
                        {"last_overflow_iteration", st.dynamic->last_overflow_iteration}};
  }
  return j;
}

void GradScaler::restore_json(const nlohmann::json& meta) {
  State saved{meta.value("skipped_steps", int64_t{0}), meta.value("unit_loss_scales", std::vector<double>{}),
              std::nullopt};
  if (meta.contains("loss_scaler")) {
    const auto& ls = meta["loss_scaler"];
    saved.dynamic = LossScaler::State{ls.at("scale").get<double>(), ls.at("hysteresis_left").get<int>(),
                                      ls.at("iteration").get<int64_t>(), ls.at("last_overflow_iteration").get<int64_t>()};
  }
  restore(saved);
}

std::string GradScalerOptions::nonfinite_cause() const {
  if (!enabled) return "";
  if (loss_scale > 0)
    return "fp16 with a fixed loss_scale of " + std::to_string(loss_scale) +
           " overflowed; use fp16.loss_scale=0 (dynamic) or bf16";
  return "fp16's range (activations beyond 65504 overflow even with loss scaling); try bf16.enabled=true";
}

}  // namespace shardlm::precision
