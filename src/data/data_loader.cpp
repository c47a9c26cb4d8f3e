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
  const int64_t global_window = static_cast<int64_t>(world_) * B_ * T_;
  steps_per_pass_ = len >= 1 ? (len - 1) / global_window : 0;
  if (steps_per_pass_ < 1) {
    fail("token file ", tokens_->source(), " has ", len, " tokens, but one step of ", world_, " ranks x ", B_, " x ", T_,
         " needs ", global_window, "+1 = ", global_window + 1,
         " tokens; use a smaller batch/seq_len or more data");
  }
  windows_ = (len - 1) / (B_ * T_);
  if (order_.shuffle && windows_ > static_cast<int64_t>(UINT32_MAX)) {
    fail("token file ", tokens_->source(), " holds ", windows_, " windows of ", B_ * T_, " tokens, more than data.shuffle ",
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

int64_t DataLoader::window_start(int64_t micro_step) const {
  if (micro_step < 0) fail("micro-step ", micro_step, " is negative (internal error)");
  if (order_.shuffle) {
    const int64_t k = micro_step * world_ + rank_;
    return static_cast<int64_t>(permutation(k / windows_)[static_cast<size_t>(k % windows_)]) * B_ * T_;
  }
  const int64_t m = micro_step % steps_per_pass_;
  return (m * world_ + rank_) * B_ * T_;
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
  tokens_->widen(start, W, inputs.data_ptr<int64_t>());
  tokens_->widen(start + 1, W, targets.data_ptr<int64_t>());
  if (device.is_cpu()) return {inputs, targets};
  return {inputs.to(device, /*non_blocking=*/true), targets.to(device, /*non_blocking=*/true)};
}

}  // namespace shardlm::data
