// Where a resumed run's data order continues. The loader's position is a pure function of the
// micro-step (data_loader.h), so a checkpoint stores only the tokens its run consumed; a run resumed
// with another global batch (another data-parallel size, micro-batch or sequence length) continues
// from those tokens, rounded down to a whole micro-step of its own layout, instead of from its own
// step position, so no window is read twice or skipped (README: Data order).
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::data {

struct ResumePosition {
  int64_t micro_step_offset = 0;  // added to step * accumulation for every later micro-step
  std::string note;               // for the log when the global batch changed; empty otherwise
};

// consumed_tokens: what the checkpoint's run read in its `start_step` steps; the rest: this run's
// layout (data-parallel ranks, micro-batch, sequence length, accumulation). `saved_batch`
// describes the checkpoint's global batch for the note.
ResumePosition resume_position(int64_t consumed_tokens, int64_t start_step, int dp, int64_t micro_batch,
                               int64_t seq_len, int64_t accumulation, const std::string& saved_batch);

}  // namespace shardlm::data
