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

// The shuffled order (data_loader.h) permutes windows of micro_batch x seq_len tokens: a run resumed
// with another window size would read another permutation, re-reading some text and skipping the
// rest, so that is refused (change the data-parallel size and accumulation instead). Turning the
// shuffle on or off, or another seed, is allowed and returns a note for the log; "" otherwise.
struct DataOrderState {
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t window_tokens = 0;  // micro_batch x seq_len
};
std::string check_resumed_order(const DataOrderState& saved, const DataOrderState& now);

}  // namespace shardlm::data
