// The data order of a run, as a pure function of (micro-step, rank) — and with shuffling, of the
// seed: llm.c's DataLoader without its cursor state, so resuming a checkpoint, replaying a run and
// comparing against llm.c need no saved loader state and cannot drift.
//
// Shuffled order (data.shuffle): the file is cut into N = (tokens - 1) / (B*T) windows of B*T tokens
// (the last token of each window's target is the next window's first); global sample k = micro_step
// x world + rank reads window perm_e(k mod N) of pass e = k / N, where perm_e is a permutation of
// [0, N) drawn from (seed, e) alone: Fisher-Yates (i from N-1 down to 1, swap i with j in [0, i])
// over the splitmix64 stream (Steele et al. 2014) started at splitmix64(seed) xor e, each draw
// mapped to [0, i] by the high 64 bits of its 128-bit product with i + 1. So every window is read once per pass,
// each pass in a new order, the same on every platform, and sample k is the same window whatever the
// data-parallel size: a run resumed on fewer ranks with more accumulation reads the same samples in
// each step.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "data/token_file.h"

namespace shardlm::data {

class DataLoader {
 public:
  // tokens are shared (not copied) between the loaders of one process, whatever their width on disk.
  // B is the micro-batch, T the sequence length; this loader serves rank `rank` of `world`
  // data-parallel ranks.
  struct Order {
    bool shuffle = false;
    uint64_t seed = 0;
  };
  DataLoader(std::shared_ptr<const Tokens> tokens, int64_t B, int64_t T, int rank, int world, Order order);
  DataLoader(std::shared_ptr<const Tokens> tokens, int64_t B, int64_t T, int rank, int world)
      : DataLoader(std::move(tokens), B, T, rank, world, Order{}) {}

  // Index of the first token of this rank's window at micro-step m (counted over the whole run):
  // ((m mod E) * world + rank) * B * T. Passing the end of the file wraps to the start, as in llm.c.
  // Shuffled: perm_e(k mod N) * B * T for k = m * world + rank (see above).
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
  // The permutation of pass `pass` (shuffled order), computed once per pass and kept.
  // 4 bytes per window (a file of up to 2^32 windows). Not thread-safe: one loader per thread.
  const std::vector<uint32_t>& permutation(int64_t pass) const;

  std::shared_ptr<const Tokens> tokens_;
  int64_t B_, T_;
  int rank_, world_;
  int64_t steps_per_pass_;
  Order order_;
  int64_t windows_ = 0;  // N: windows of B*T tokens in the file
  mutable int64_t perm_pass_ = -1;
  mutable std::vector<uint32_t> perm_;
};

}  // namespace shardlm::data
