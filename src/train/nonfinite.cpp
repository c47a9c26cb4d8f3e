// Non-finite weights and losses, explained (nonfinite.h).
#include "train/nonfinite.h"

#include "train/config_options.h"

#include <ATen/ATen.h>

#include <sstream>

#include "util/error.h"

namespace shardlm::train {

void check_finite_weights(const model::Llama& model, const std::string& source) {
  for (const auto& p : model.parameters()) {
    const int64_t bad = p.tensor.numel() - at::isfinite(p.tensor).sum().item<int64_t>();
    if (bad > 0)
      fail("weights in '", source, "' hold NaN or inf: ", bad, " of ", p.tensor.numel(), " values of ", p.name,
           ". The file was saved from a diverged run or is damaged; start from an earlier checkpoint or without init");
  }
}

std::string nonfinite_loss_message(const TrainConfig& cfg, double loss, int64_t step, bool first_step_of_run) {
  std::ostringstream out;
  out << "loss became " << loss << " at step " << step << ". Likely causes: ";
  int n = 0;
  const auto cause = [&](const std::string& text) {
    ++n;
    out << (n > 1 ? "; " : "") << "(" << n << ") " << text;
  };
  if (first_step_of_run && !cfg.init.empty())
    cause("the init weights in '" + cfg.init + "' (already NaN at the first step: check them, e.g. with a fresh init)");
  if (const std::string hint = grad_scaler_options(cfg).nonfinite_cause(); !hint.empty()) cause(hint);
  cause("a learning rate too high for this model (optimizer.params.lr = " + std::to_string(cfg.optimizer.lr) + "); lower it" +
        (cfg.scheduler.warmup_num_steps == 0 ? " or add scheduler warm-up steps" : ""));
  if (cfg.gradient_clipping == 0) cause("no gradient clipping; set gradient_clipping (e.g. 1.0)");
  return out.str();
}

}  // namespace shardlm::train
