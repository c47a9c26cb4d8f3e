// The data order of a run, as a pure function of (micro-step, rank): llm.c's DataLoader without its
// cursor state, so resuming a checkpoint, replaying a run and comparing against llm.c need no saved
// loader state and cannot drift.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "data/token_file.h"

namespace shardlm::data {

class DataLoader {
 public:
  // tokens are shared (not copied) between the loaders of one process, whatever their width on disk.
  // B is the micro-batch, T the sequence length; this loader serves rank `rank` of `world`
  // data-parallel ranks.
  DataLoader(std::shared_ptr<const Tokens> tokens, int64_t B, int64_t T, int rank, int world);

  // Index of the first token of this rank's window at micro-step m (counted over the whole run):
  // ((m mod E) * world + rank) * B * T. Passing the end of the file wraps to the start, as in llm.c.
  int64_t window_start(int64_t micro_step) const;

  struct Batch {
    at::Tensor inputs;   // int64 [B, T]: tokens [start, start + B*T)
    at::Tensor targets;  // int64 [B, T]: tokens [start + 1, start + B*T + 1)
  };
  Batch batch(int64_t micro_step) const;
  // The same batch on `device`. For a GPU the tokens are assembled in pinned host memory and
  // copied asynchronously, so the copy is queued behind the work already on the stream instead
  // of stopping the host.
  Batch batch(int64_t micro_step, c10::Device device) const;

  // E: global micro-steps (all ranks together) that fit in one pass over the file.
  int64_t micro_steps_per_pass() const { return steps_per_pass_; }

  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  int64_t num_tokens() const { return tokens_->size(); }

 private:
  std::shared_ptr<const Tokens> tokens_;
  int64_t B_, T_;
  int rank_, world_;
  int64_t steps_per_pass_;
};

}  // namespace shardlm::data
