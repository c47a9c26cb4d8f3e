// Window arithmetic and batch assembly for DataLoader. One window of B*T+1 tokens serves both
// inputs and targets (shifted by one), which is why consecutive windows overlap by one token; the
// batch is assembled row by row, each row T + 1 tokens of one dataset.
#include "data/loader/data_loader.h"

#include <utility>

#include "util/error.h"

namespace shardlm::data {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t seed_key(uint64_t seed) { return splitmix64(seed); }

}  // namespace

DataLoader::Source DataLoader::open_source(std::shared_ptr<const Tokens> tokens, int64_t T) {
  if (!tokens) fail("DataLoader was given no token buffer (internal error: load the file first)");
  Source s;
  s.masks = read_loss_masks(*tokens);
  const int64_t len = tokens->size();
  if (s.masks) {
    // Fine-tuning rows of T + 1 tokens, cut when the data was prepared.
    const int64_t R = s.masks->row_length;
    if (R != T + 1) {
      fail("fine-tuning data ", tokens->source(), " was prepared in rows of ", R, " tokens (--seq-len ", R - 1,
           "), but the run's sequence length is ", T, "; set data.seq_len to ", R - 1,
           " or prepare the data again with --seq-len ", T);
    }
    s.stride = R;
    s.rows = len / R;
    s.counted.resize(static_cast<size_t>(s.rows));
    for (int64_t r = 0; r < s.rows; ++r) {
      const unsigned char* bits = s.masks->row(r * R);
      int32_t n = 0;
      for (int64_t j = 1; j < R; ++j) n += bits[j] & kCountsInLoss;
      s.counted[static_cast<size_t>(r)] = n;
    }
  } else {
    s.stride = T;
    s.rows = len >= 1 ? (len - 1) / T : 0;
  }
  s.tokens = std::move(tokens);
  return s;
}

DataLoader::DataLoader(std::shared_ptr<const Tokens> tokens, int64_t B, int64_t T, int rank, int world, Order order)
    : DataLoader(std::vector<Dataset>{{std::move(tokens), 1.0}}, B, T, rank, world, order) {}

DataLoader::DataLoader(std::vector<Dataset> datasets, int64_t B, int64_t T, int rank, int world, Order order)
    : B_(B), T_(T), rank_(rank), world_(world), order_(order) {
  if (datasets.empty()) fail("DataLoader was given no dataset (internal error)");
  if (B_ < 1 || T_ < 1) {
    fail("micro-batch size ", B_, " and sequence length ", T_, " must both be at least 1; ",
         "fix batch.micro_batch / model.seq_len in the config");
  }
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    fail("data-parallel rank ", rank_, " of ", world_, " ranks is out of range (internal error)");
  }
  std::vector<double> weights;
  for (auto& d : datasets) {
    sources_.push_back(open_source(std::move(d.tokens), T_));
    weights.push_back(d.weight);
    any_masks_ = any_masks_ || sources_.back().masks;
  }
  if (sources_.size() > 1) {
    blend_ = std::make_unique<BlendedOrder>(weights);
    for (const Source& s : sources_) {
      if (s.rows < 1)
        fail("blended dataset ", s.tokens->source(), " has ", s.tokens->size(), " tokens, fewer than one sequence of ",
             T_ + 1, " (data.seq_len + 1); give it more text or leave it out of data.blend");
      if (order_.shuffle && s.rows > static_cast<int64_t>(UINT32_MAX))
        fail("blended dataset ", s.tokens->source(), " holds ", s.rows, " sequences, more than data.shuffle orders "
             "(2^32); use a longer data.seq_len, or split it into several datasets");
    }
    return;
  }
  const Source& s = sources_[0];
  if (s.masks) {
    steps_per_pass_ = s.rows / (static_cast<int64_t>(world_) * B_);
    windows_ = s.rows / B_;
    if (steps_per_pass_ < 1) {
      fail("fine-tuning data ", s.tokens->source(), " has ", s.rows, " rows of ", s.stride, " tokens, but one step of ",
           world_, " ranks x micro-batch ", B_, " needs ", world_ * B_, " rows; use a smaller batch or more samples");
    }
  } else {
    const int64_t len = s.tokens->size();
    const int64_t global_window = static_cast<int64_t>(world_) * B_ * T_;
    steps_per_pass_ = len >= 1 ? (len - 1) / global_window : 0;
    if (steps_per_pass_ < 1) {
      fail("token file ", s.tokens->source(), " has ", len, " tokens, but one step of ", world_, " ranks x ", B_, " x ",
           T_, " needs ", global_window, "+1 = ", global_window + 1,
           " tokens; use a smaller batch/seq_len or more data");
    }
    windows_ = (len - 1) / (B_ * T_);
  }
  if (order_.shuffle && windows_ > static_cast<int64_t>(UINT32_MAX)) {
    fail("token file ", s.tokens->source(), " holds ", windows_, " windows of ", B_ * s.stride,
         " tokens, more than data.shuffle orders (2^32); use a larger micro-batch or seq_len, or split the data");
  }
}

int64_t DataLoader::num_tokens() const {
  int64_t n = 0;
  for (const Source& s : sources_) n += s.tokens->size();
  return n;
}

const std::vector<uint32_t>& DataLoader::permutation(Source& s, int64_t n, uint64_t key, int64_t pass) const {
  if (pass == s.permuted_pass) return s.permutation;
  auto& perm = s.permutation;
  perm.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  uint64_t state = key;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(splitmix64(state)) * (i + 1)) >> 64);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  s.permuted_pass = pass;
  return perm;
}

int64_t DataLoader::window_of(int64_t micro_step, int rank) const {
  if (micro_step < 0) fail("micro-step ", micro_step, " is negative (internal error)");
  if (order_.shuffle) {
    const int64_t k = micro_step * world_ + rank, pass = k / windows_;
    const uint64_t key = seed_key(order_.seed) ^ static_cast<uint64_t>(pass);  // (seed, pass) -> stream
    return static_cast<int64_t>(permutation(sources_[0], windows_, key, pass)[static_cast<size_t>(k % windows_)]);
  }
  // Global sample k reads window k mod N: a function of k alone, so another data-parallel size reads
  // the same samples in each step, past the end of the file too.
  return (micro_step * world_ + rank) % windows_;
}

int64_t DataLoader::window_start(int64_t micro_step) const {
  if (blend_) fail("window_start is defined for one dataset only (internal error)");
  std::lock_guard<std::mutex> lock(*mutex_);
  return window_of(micro_step, rank_) * B_ * sources_[0].stride;
}

DataLoader::RowRef DataLoader::row_locked(int64_t micro_step, int rank, int64_t b) const {
  if (!blend_) return {0, (window_of(micro_step, rank) * B_ + b) * sources_[0].stride};
  if (micro_step < 0) fail("micro-step ", micro_step, " is negative (internal error)");
  const auto pick = blend_->at((micro_step * world_ + rank) * B_ + b);
  Source& s = sources_[static_cast<size_t>(pick.dataset)];
  const int64_t pass = pick.index / s.rows, j = pick.index % s.rows;
  int64_t r = j;
  if (order_.shuffle) {
    const uint64_t key = seed_key(order_.seed) ^ static_cast<uint64_t>(pass) ^
                         (static_cast<uint64_t>(pick.dataset + 1) << 48);
    r = permutation(s, s.rows, key, pass)[static_cast<size_t>(j)];
  }
  return {pick.dataset, r * s.stride};
}

DataLoader::RowRef DataLoader::row(int64_t micro_step, int rank, int64_t b) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  return row_locked(micro_step, rank, b);
}

int32_t DataLoader::counted_in_row(const RowRef& r) const {
  const Source& s = sources_[static_cast<size_t>(r.dataset)];
  return s.masks ? s.counted[static_cast<size_t>(r.start / s.stride)] : static_cast<int32_t>(T_);
}

int64_t DataLoader::counted_targets(int64_t micro_step, int rank) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  int64_t n = 0;
  for (int64_t b = 0; b < B_; ++b) n += counted_in_row(row_locked(micro_step, rank, b));
  return n;
}

DataLoader::Batch DataLoader::batch(int64_t micro_step) const { return batch(micro_step, c10::Device(c10::kCPU)); }

DataLoader::Batch DataLoader::batch(int64_t micro_step, c10::Device device) const {
  return to_device(host_batch(micro_step, device.is_cuda()), device);
}

DataLoader::Batch DataLoader::host_batch(int64_t micro_step, bool pinned) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  // Tokens are widened into int64 (what embedding takes); inputs and targets get their own storage
  // so an in-place op on one cannot change the other.
  const auto host = at::TensorOptions().dtype(at::kLong).pinned_memory(pinned);
  at::Tensor inputs = at::empty({B_, T_}, host);
  at::Tensor targets = at::empty({B_, T_}, host);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  Batch b;
  b.inputs = inputs;
  b.targets = targets;
  if (!any_masks_ && !blend_) {  // one window of B*T + 1 consecutive tokens
    const Source& s = sources_[0];
    const int64_t start = window_of(micro_step, rank_) * B_ * s.stride;
    s.tokens->widen(start, B_ * T_, in);
    s.tokens->widen(start + 1, B_ * T_, tg);
    return b;
  }
  std::vector<int64_t> row(static_cast<size_t>(T_ + 1));
  at::Tensor positions = at::empty({B_, T_}, host), segments = at::empty({B_, T_}, host);
  int64_t* pos = positions.data_ptr<int64_t>();
  int64_t* seg = segments.data_ptr<int64_t>();
  bool packed = false;
  for (int64_t r = 0; r < B_; ++r) {
    const RowRef ref = row_locked(micro_step, rank_, r);
    const Source& s = sources_[static_cast<size_t>(ref.dataset)];
    s.tokens->widen(ref.start, T_ + 1, row.data());
    // Pretraining text: one sequence whose targets all count.
    const unsigned char* bits = s.masks ? s.masks->row(ref.start) : nullptr;
    int64_t segment = bits ? -1 : 0, begin = 0;
    for (int64_t j = 0; j < T_; ++j) {
      if (bits && (bits[j] & kDocumentStart)) {
        ++segment;
        begin = j;
      }
      in[r * T_ + j] = row[static_cast<size_t>(j)];
      tg[r * T_ + j] = (!bits || (bits[j + 1] & kCountsInLoss)) ? row[static_cast<size_t>(j + 1)] : kIgnoreIndex;
      pos[r * T_ + j] = j - begin;
      seg[r * T_ + j] = segment;
    }
    packed = packed || segment > 0;
  }
  if (packed) {
    b.positions = positions;
    b.segments = segments;
  }
  if (any_masks_) {
    b.world = world_;
    b.counted_all_ranks = 0;
    for (int rank = 0; rank < world_; ++rank)
      for (int64_t r = 0; r < B_; ++r) b.counted_all_ranks += counted_in_row(row_locked(micro_step, rank, r));
  }
  return b;
}

DataLoader::Batch DataLoader::to_device(Batch b, c10::Device device) {
  if (device.is_cpu()) return b;
  for (at::Tensor* t : {&b.inputs, &b.targets, &b.positions, &b.segments})
    if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
  return b;
}

}  // namespace shardlm::data
