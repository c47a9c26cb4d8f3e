// Window arithmetic and batch assembly for DataLoader. One window of B*T+1 tokens serves both
// inputs and targets (shifted by one), which is why consecutive windows overlap by one token.
#include "data/data_loader.h"

#include <utility>

#include "util/error.h"

namespace shardlm::data {

DataLoader::DataLoader(std::shared_ptr<const Tokens> tokens, int64_t B, int64_t T, int rank, int world, Order order)
    : tokens_(std::move(tokens)), B_(B), T_(T), rank_(rank), world_(world), order_(order) {
  if (!tokens_) fail("DataLoader was given no token buffer (internal error: load the file first)");
  if (B_ < 1 || T_ < 1) {
    fail("micro-batch size ", B_, " and sequence length ", T_, " must both be at least 1; ",
         "fix batch.micro_batch / model.seq_len in the config");
  }
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    fail("data-parallel rank ", rank_, " of ", world_, " ranks is out of range (internal error)");
  }
  const int64_t len = tokens_->size();
  masks_ = read_loss_masks(*tokens_);
  if (masks_) {
    // Fine-tuning rows of T + 1 tokens, cut when the data was prepared.
    const int64_t R = masks_->row_length;
    if (R != T_ + 1) {
      fail("fine-tuning data ", tokens_->source(), " was prepared in rows of ", R, " tokens (--seq-len ", R - 1,
           "), but the run's sequence length is ", T_, "; set data.seq_len to ", R - 1,
           " or prepare the data again with --seq-len ", T_);
    }
    const int64_t rows = len / R;
    stride_ = B_ * R;
    steps_per_pass_ = rows / (static_cast<int64_t>(world_) * B_);
    windows_ = rows / B_;
    if (steps_per_pass_ < 1) {
      fail("fine-tuning data ", tokens_->source(), " has ", rows, " rows of ", R, " tokens, but one step of ", world_,
           " ranks x micro-batch ", B_, " needs ", world_ * B_, " rows; use a smaller batch or more samples");
    }
    row_counted_.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      int32_t n = 0;
      for (int64_t j = 1; j < R; ++j) n += masks_->bits[static_cast<size_t>(r * R + j)] & kCountsInLoss;
      row_counted_[static_cast<size_t>(r)] = n;
    }
  } else {
    const int64_t global_window = static_cast<int64_t>(world_) * B_ * T_;
    stride_ = B_ * T_;
    steps_per_pass_ = len >= 1 ? (len - 1) / global_window : 0;
    if (steps_per_pass_ < 1) {
      fail("token file ", tokens_->source(), " has ", len, " tokens, but one step of ", world_, " ranks x ", B_, " x ", T_,
           " needs ", global_window, "+1 = ", global_window + 1,
           " tokens; use a smaller batch/seq_len or more data");
    }
    windows_ = (len - 1) / (B_ * T_);
  }
  if (order_.shuffle && windows_ > static_cast<int64_t>(UINT32_MAX)) {
    fail("token file ", tokens_->source(), " holds ", windows_, " windows of ", stride_, " tokens, more than data.shuffle ",
         "orders (2^32); use a larger micro-batch or seq_len, or split the data");
  }
}

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

const std::vector<uint32_t>& DataLoader::permutation(int64_t pass) const {
  if (pass == perm_pass_) return perm_;
  perm_.resize(static_cast<size_t>(windows_));
  for (int64_t i = 0; i < windows_; ++i) perm_[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  uint64_t state = order_.seed;
  const uint64_t pass_key = splitmix64(state) ^ static_cast<uint64_t>(pass);  // (seed, pass) -> stream
  state = pass_key;
  for (int64_t i = windows_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(splitmix64(state)) * (i + 1)) >> 64);
    std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
  }
  perm_pass_ = pass;
  return perm_;
}

int64_t DataLoader::window_of(int64_t micro_step, int rank) const {
  if (micro_step < 0) fail("micro-step ", micro_step, " is negative (internal error)");
  if (order_.shuffle) {
    const int64_t k = micro_step * world_ + rank;
    return static_cast<int64_t>(permutation(k / windows_)[static_cast<size_t>(k % windows_)]);
  }
  const int64_t m = micro_step % steps_per_pass_;
  return m * world_ + rank;
}

int64_t DataLoader::window_start(int64_t micro_step) const { return window_of(micro_step, rank_) * stride_; }

int64_t DataLoader::counted_targets(int64_t micro_step, int rank) const {
  if (!masks_) return B_ * T_;
  const int64_t first_row = window_of(micro_step, rank) * B_;
  int64_t n = 0;
  for (int64_t r = first_row; r < first_row + B_; ++r) n += row_counted_[static_cast<size_t>(r)];
  return n;
}

DataLoader::Batch DataLoader::batch(int64_t micro_step) const { return batch(micro_step, c10::Device(c10::kCPU)); }

DataLoader::Batch DataLoader::batch(int64_t micro_step, c10::Device device) const {
  const int64_t start = window_start(micro_step);
  const int64_t W = B_ * T_;
  // Tokens are widened into int64 (what embedding takes); inputs and targets get their own storage
  // so an in-place op on one cannot change the other.
  const auto host = at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda());
  at::Tensor inputs = at::empty({B_, T_}, host);
  at::Tensor targets = at::empty({B_, T_}, host);
  Batch b;
  if (!masks_) {
    tokens_->widen(start, W, inputs.data_ptr<int64_t>());
    tokens_->widen(start + 1, W, targets.data_ptr<int64_t>());
  } else {
    const int64_t R = T_ + 1;
    std::vector<int64_t> row(static_cast<size_t>(R));
    at::Tensor positions = at::empty({B_, T_}, host), segments = at::empty({B_, T_}, host);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* tg = targets.data_ptr<int64_t>();
    int64_t* pos = positions.data_ptr<int64_t>();
    int64_t* seg = segments.data_ptr<int64_t>();
    bool packed = false;
    for (int64_t r = 0; r < B_; ++r) {
      const int64_t first = start + r * R;
      tokens_->widen(first, R, row.data());
      const unsigned char* bits = masks_->bits.data() + first;
      int64_t segment = -1, begin = 0;
      for (int64_t j = 0; j < T_; ++j) {
        if (bits[j] & kDocumentStart) {
          ++segment;
          begin = j;
        }
        in[r * T_ + j] = row[static_cast<size_t>(j)];
        tg[r * T_ + j] = (bits[j + 1] & kCountsInLoss) ? row[static_cast<size_t>(j + 1)] : kIgnoreIndex;
        pos[r * T_ + j] = j - begin;
        seg[r * T_ + j] = segment;
      }
      packed = packed || segment > 0;
    }
    if (packed) {
      b.positions = positions;
      b.segments = segments;
    }
    b.world = world_;
    b.counted_all_ranks = 0;
    for (int r = 0; r < world_; ++r) b.counted_all_ranks += counted_targets(micro_step, r);
  }
  b.inputs = inputs;
  b.targets = targets;
  if (device.is_cpu()) return b;
  for (at::Tensor* t : {&b.inputs, &b.targets, &b.positions, &b.segments})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  return b;
}

}  // namespace shardlm::data
