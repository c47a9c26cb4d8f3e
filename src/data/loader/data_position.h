// Where a resumed run's data order continues. The loader's position is a pure function of the
// global sample index k = micro-step x dp + rank (data_loader.h), also past a wrap of the file, so a
// checkpoint stores only the samples (and tokens) its run consumed and the batch it ran with. On resume:
//   - another number of data-parallel ranks with the checkpoint's own batch settings keeps the
//     global batch: gradient_accumulation_steps is scaled (x2 on half the ranks) so that steps s+1
//     onward read the same global samples; a rank count that does not divide the global batch is
//     refused (as elastic restarts need: a count that divides it, accumulation adjusted);
//   - a global batch changed on purpose (another accumulation, micro-batch or sequence length)
//     continues from the tokens consumed, rounded down to a whole micro-step of the new layout, so
//     no window is read twice or skipped;
//   - another data.blend (other datasets or weights) draws other samples from step s+1 on: allowed,
//     with a note (a curriculum changes its mix on purpose);
//   - the shuffled order permutes windows of micro_batch x seq_len tokens: another window size would
//     read another permutation, so that is refused; turning the shuffle on or off, or another seed,
//     is allowed with a note.
// (docs/data.md, Data order.)
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::data {

// This run's data layout.
struct DataLayout {
  int dp = 1;
  int64_t micro_batch = 1, seq_len = 1;
  int64_t accumulation = 1;             // as the config resolved it for this job
  bool shuffle = false;
  uint64_t seed = 0;
  std::string blend;  // data.blend as blend_text writes it; "" for one dataset
};

// data.blend's (weight, file) pairs as one line, "0.7 a.bin 0.3 b_*.bin" (Megatron's --data-path).
std::string blend_text(const std::vector<std::pair<double, std::string>>& blend);

struct ResumedData {
  int64_t accumulation = 1;       // what the run uses from now on
  int64_t micro_step_offset = 0;  // added to step * accumulation for every later micro-step
  std::vector<std::string> notes; // for the log
};

// The checkpoint's meta as the trainer writes it (checkpoint_meta below) and this run's layout.
ResumedData resume_data(const nlohmann::json& meta, int64_t start_step, const DataLayout& now);

// What a checkpoint records of the data layout (merged into its checkpoint.json), with the tokens
// consumed so far. configured_accumulation: the accumulation the config asked for (before a resume
// scaled it), so a later resume with the same config still recognises it as unchanged.
nlohmann::json checkpoint_meta(const DataLayout& now, int64_t configured_accumulation);

}  // namespace shardlm::data
