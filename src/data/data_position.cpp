// See data_position.h.
#include "data/data_position.h"

namespace shardlm::data {

ResumePosition resume_position(int64_t consumed, int64_t start_step, int dp, int64_t micro_batch, int64_t seq_len,
                               int64_t accumulation, const std::string& saved_batch) {
  ResumePosition p;
  const int64_t per_micro_step = dp * micro_batch * seq_len;
  if (consumed == start_step * accumulation * per_micro_step) return p;
  p.micro_step_offset = consumed / per_micro_step - start_step * accumulation;
  p.note = "the global batch changed (" + saved_batch + " tokens per step, now " +
           std::to_string(accumulation * dp) + " of " + std::to_string(micro_batch) + "x" + std::to_string(seq_len) +
           "): continuing from the " + std::to_string(consumed) + " tokens the checkpoint consumed, at token " +
           std::to_string((consumed / per_micro_step) * per_micro_step) +
           (consumed % per_micro_step ? " (rounded down to a whole step of this layout)" : "") +
           " (README: Data order)";
  return p;
}

}  // namespace shardlm::data
