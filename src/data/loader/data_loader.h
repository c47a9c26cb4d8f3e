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
// Sequential order (the default): global sample k = micro_step x world + rank reads window k mod N,
// N = (tokens - 1) / (B*T) windows, i.e. the B*T+1 tokens from (k mod N) x B*T. Before the end of the
// file that is llm.c's order ((m x world + rank) x B*T); past it, the order wraps per global sample, so
// sample k is the same window whatever the data-parallel size, as in the shuffled order.
//
// Fine-tuning data (a token file with its loss-mask sidecar, data/loader/loss_mask.h) is read in rows of
// T + 1 tokens fixed at prepare time instead of a stream: the same order over windows of B rows
// (row-window w holds rows [w*B, (w+1)*B); sequential: w = k mod N; shuffled: w = perm_e(k mod N);
// N = rows / B). A row's inputs are its first T
// tokens, its targets its last T, a target that does not count (prompt, padding, the next sample's
// first token) set to kIgnoreIndex; rows that pack several samples also get per-sample positions and
// segment ids (attention stays inside a sample).
//
// Several datasets with weights (data.blend; Megatron-LM's blending, data/loader/blend.h) are read in rows
// of T + 1 tokens, sequence by sequence: global sequence g = (micro_step x world + rank) x B + b (row b
// of the micro-batch) comes from dataset d, as its j-th sample (BlendedOrder). Dataset d's sample j
// is its row j mod R_d (R_d = (tokens - 1) / T rows of pretraining text starting every T tokens, or
// its fine-tuning rows), or with data.shuffle its row pi_{d,e}(j mod R_d) of pass e = j / R_d, pi as
// above with the stream started at splitmix64(seed) xor e xor ((d + 1) << 48). A row's targets count
// as in its own dataset (all of them for pretraining text); as soon as one dataset is fine-tuning
// data, every batch reports its counted targets so the loss is normalised over the global batch.
// The loader's methods may be called from several threads (a prefetch thread and the trainer).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "data/loader/blend.h"
#include "data/loader/loss_mask.h"
#include "data/loader/token_file.h"

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
  // Several datasets blended by weight (see above); one dataset reads as the constructor above.
  struct Dataset {
    std::shared_ptr<const Tokens> tokens;
    double weight = 1.0;
  };
  DataLoader(std::vector<Dataset> datasets, int64_t B, int64_t T, int rank, int world, Order order);

  // Index of the first token of this rank's window at micro-step m (counted over the whole run):
  // (k mod N) * B * T for global sample k = m * world + rank, N = (tokens - 1) / (B*T): passing the end
  // of the file wraps to the start per global sample. Shuffled: perm_e(k mod N) * B * T (see above).
  // One dataset only.
  int64_t window_start(int64_t micro_step) const;
  // The dataset and the first token of row b of rank `rank`'s micro-batch at micro-step m.
  struct RowRef {
    int dataset = 0;
    int64_t start = 0;
  };
  RowRef row(int64_t micro_step, int rank, int64_t b) const;

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
  // The two halves of that: the batch in host memory (pinned when it is bound for a GPU), and its
  // (asynchronous) copy to the device. A prefetch thread runs the first, the step the second.
  Batch host_batch(int64_t micro_step, bool pinned) const;
  static Batch to_device(Batch host, c10::Device device);

  // E: global micro-steps (all ranks together) that fit before the first wrap of the file,
  // floor(N / world) (one dataset; blended datasets each wrap on their own). Later passes start
  // wherever global sample k = N, 2N, ... falls, not at a micro-step boundary.
  int64_t micro_steps_per_pass() const { return steps_per_pass_; }

  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  int64_t num_tokens() const;  // of every dataset
  // Fine-tuning data (a loss-mask sidecar was found) of one dataset: rows and masks; nullptr for
  // pretraining data and for a blend.
  const LossMasks* masks() const { return sources_.size() == 1 ? sources_[0].masks.get() : nullptr; }
  // The targets that count in rank `rank`'s batch at micro-step m (fine-tuning; B*T otherwise).
  int64_t counted_targets(int64_t micro_step, int rank) const;

 private:
  // One token file the loader reads rows of T + 1 tokens from.
  struct Source {
    std::shared_ptr<const Tokens> tokens;
    std::shared_ptr<const LossMasks> masks;  // fine-tuning rows; nullptr for pretraining text
    int64_t stride = 0;                      // tokens from one row's start to the next: T, or T + 1
    int64_t rows = 0;
    std::vector<int32_t> counted;            // fine-tuning: targets that count, per row
    int64_t permuted_pass = -1;              // the pass `permutation` holds (shuffled order)
    std::vector<uint32_t> permutation;       // 4 bytes per row (blend) or window (one dataset)
  };
  static Source open_source(std::shared_ptr<const Tokens> tokens, int64_t T);
  // The permutation of pass `pass` of `n` items, drawn from `key` (splitmix64(seed) xor pass, and
  // for a blended dataset xor (d + 1) << 48), kept in `s` until another pass is asked for.
  const std::vector<uint32_t>& permutation(Source& s, int64_t n, uint64_t key, int64_t pass) const;
  int64_t window_of(int64_t micro_step, int rank) const;  // one dataset: the window index (see above)
  RowRef row_locked(int64_t micro_step, int rank, int64_t b) const;  // row() with mutex_ held
  int32_t counted_in_row(const RowRef& r) const;

  int64_t B_, T_;
  int rank_, world_;
  int64_t steps_per_pass_ = 0;
  Order order_;
  int64_t windows_ = 0;  // one dataset: N windows of B*T tokens (fine-tuning: of B rows) in the file
  // Guards the permutations and the blend's cursor (the loader's only state beyond its inputs).
  // (behind a pointer so that a loader can move).
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  mutable std::vector<Source> sources_;
  mutable std::unique_ptr<BlendedOrder> blend_;  // several datasets
  bool any_masks_ = false;
};

}  // namespace shardlm::data
