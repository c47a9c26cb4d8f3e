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
//
// Fine-tuning data (a token file with its loss-mask sidecar, data/loss_mask.h) is read in rows of
// T + 1 tokens fixed at prepare time instead of a stream: the same order over windows of B rows
// (row-window w holds rows [w*B, (w+1)*B); sequential: w = (m mod E) * world + rank with E =
// rows / (world * B); shuffled: w = perm_e(k mod N), N = rows / B). A row's inputs are its first T
// tokens, its targets its last T, a target that does not count (prompt, padding, the next sample's
// first token) set to kIgnoreIndex; rows that pack several samples also get per-sample positions and
// segment ids (attention stays inside a sample).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "data/loss_mask.h"
#include "data/token_file.h"

namespace shardlm::data {

// A target that is not scored (transformers' labels = -100, cross_entropy's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

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
    at::Tensor inputs;   // int64 [B, T]: tokens [start, start + B*T) (fine-tuning: each row's first T)
    at::Tensor targets;  // int64 [B, T]: tokens [start + 1, start + B*T + 1) (fine-tuning: each row's
                         // last T, kIgnoreIndex where the target does not count)
    // Fine-tuning rows that pack several samples (undefined otherwise: positions 0..T-1, one causal
    // sequence per row): int64 [B, T] position of each input in its sample (restarting at 0), and its
    // sample's index within the row.
    at::Tensor positions, segments;
    // Fine-tuning: the targets that count at this micro-step summed over every data-parallel rank's
    // batch (the loader is world-independent, so each rank knows them without communicating); -1
    // for pretraining data, where every target counts.
    int64_t counted_all_ranks = -1;
    int world = 1;  // the data-parallel ranks the loader serves
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
  // Fine-tuning data (a loss-mask sidecar was found): rows and masks; nullptr for pretraining.
  const LossMasks* masks() const { return masks_.get(); }
  // The targets that count in rank `rank`'s batch at micro-step m (fine-tuning; B*T otherwise).
  int64_t counted_targets(int64_t micro_step, int rank) const;

 private:
  // The permutation of pass `pass` (shuffled order), computed once per pass and kept.
  // 4 bytes per window (a file of up to 2^32 windows). Not thread-safe: one loader per thread.
  const std::vector<uint32_t>& permutation(int64_t pass) const;
  int64_t window_of(int64_t micro_step, int rank) const;  // the window index (see above)

  std::shared_ptr<const Tokens> tokens_;
  int64_t B_, T_;
  int rank_, world_;
  int64_t steps_per_pass_;
  Order order_;
  int64_t windows_ = 0;  // N: windows of B*T tokens (fine-tuning: of B rows) in the file
  int64_t stride_ = 0;   // tokens from one window's start to the next: B*T (fine-tuning: B*(T+1))
  std::shared_ptr<const LossMasks> masks_;
  std::vector<int32_t> row_counted_;  // fine-tuning: targets that count, per row
  mutable int64_t perm_pass_ = -1;
  mutable std::vector<uint32_t> perm_;
};

}  // namespace shardlm::data
