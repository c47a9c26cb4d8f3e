// See data_position.h.
#include "data/data_position.h"

#include "util/error.h"

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

std::string check_resumed_order(const DataOrderState& saved, const DataOrderState& now) {
  if (saved.shuffle && now.shuffle && saved.window_tokens != now.window_tokens) {
    fail("the checkpoint's run shuffled windows of ", saved.window_tokens, " tokens (micro-batch x seq_len) and this ",
         "one would shuffle windows of ", now.window_tokens, ": another permutation, which would re-read some text and ",
         "skip the rest. Resume with the same train_micro_batch_size_per_gpu and data.seq_len (change the ranks and ",
         "gradient_accumulation_steps instead), or start over with --resume=false");
  }
  if (saved.shuffle != now.shuffle)
    return std::string("the data order changed on resume: data.shuffle was ") + (saved.shuffle ? "true" : "false") +
           ", now " + (now.shuffle ? "true" : "false");
  if (now.shuffle && saved.seed != now.seed)
    return "the data order changed on resume: the shuffle seed was " + std::to_string(saved.seed) + ", now " +
           std::to_string(now.seed);
  return "";
}

}  // namespace shardlm::data
