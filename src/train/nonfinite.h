// What to say when numbers stop being numbers. A NaN loss used to be blamed on the learning rate
// and clipping only; NaN or inf weights in an `init` checkpoint, an fp16 fixed loss scale that
// overflows, or a first step that is already NaN point elsewhere, and the message should say so.
#pragma once
#include <cstdint>
#include <string>

#include "model/llama.h"
#include "train/config.h"

namespace shardlm::train {

// Refuses weights holding NaN or inf, naming the first such tensor and `source` (e.g. the init file).
void check_finite_weights(const model::Llama& model, const std::string& source);

// The message for a non-finite loss at `step`: the likely causes for this config, most likely first.
std::string nonfinite_loss_message(const TrainConfig& cfg, double loss, int64_t step, bool first_step_of_run);

}  // namespace shardlm::train
