#include "parallel/zero/zero_buckets.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "util/error.h"

namespace shardlm::parallel {

ReduceScatterBuckets::ReduceScatterBuckets(std::vector<int64_t> shard_numel, int64_t cap, comm::CommPtr dp,
                                           at::TensorOptions buffer, Deliver deliver)
    : shard_numel_(std::move(shard_numel)), dp_(std::move(dp)), buffer_(buffer), deliver_(std::move(deliver)) {
  if (cap <= 0) fail("zero_optimization.reduce_bucket_size must be positive, got ", cap);
  const int64_t n = dp_->size();
  bucket_of_.assign(shard_numel_.size(), kNoBucket);
  offset_.assign(shard_numel_.size(), 0);
  ready_.assign(shard_numel_.size(), 0);
  for (size_t u = 0; u < shard_numel_.size(); ++u) {
    // An empty unit (another pipeline stage's) never gets gradients here: in a bucket it would
    // hold the bucket back until the next flush.
    if (shard_numel_[u] == 0) continue;
    if (buckets_.empty() || n * (buckets_.back().numel + shard_numel_[u]) > cap) buckets_.push_back({});
    auto& b = buckets_.back();
    b.units.push_back(u);
    offset_[u] = b.numel;
    b.numel += shard_numel_[u];
    b.pending++;
    bucket_of_[u] = buckets_.size() - 1;
    largest_ = std::max(largest_, b.numel);
  }
}

int ReduceScatterBuckets::take_slot() {
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].bucket < 0) return static_cast<int>(s);
  // No free pair: the oldest reduction in flight lands and gives its pair up. Pairs still being
  // filled (their bucket not launched) cannot be waited for; with none launched, add a pair.
  int oldest = -1;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].work && (oldest < 0 || slots_[s].launched_order < slots_[oldest].launched_order))
      oldest = static_cast<int>(s);
  if (oldest >= 0) {
    finish(oldest);
    return oldest;
  }
  Slot fresh;
  fresh.send = at::empty({dp_->size() * largest_}, buffer_);
  fresh.recv = at::empty({largest_}, buffer_);
  slots_.push_back(std::move(fresh));
  return static_cast<int>(slots_.size()) - 1;
}

at::Tensor ReduceScatterBuckets::send_rows(size_t u) {
  const int64_t n = dp_->size();
  if (bucket_of_[u] == kNoBucket) return at::empty({n, 0}, buffer_);
  auto& b = buckets_[bucket_of_[u]];
  if (b.slot >= 0 && slots_[b.slot].work) finish(b.slot);  // last micro-step's reduction of this bucket
  if (b.slot < 0) {
    b.slot = take_slot();
    slots_[b.slot].bucket = static_cast<int>(bucket_of_[u]);
  }
  return slots_[b.slot].send.narrow(0, 0, n * b.numel).view({n, b.numel}).narrow(1, offset_[u],
                                                                                   shard_numel_[u]);
}

void ReduceScatterBuckets::unit_ready(size_t u) {
  const size_t bi = bucket_of_[u];
  if (bi == kNoBucket) return;  // nothing to reduce
  auto& b = buckets_[bi];
  if (b.slot < 0 || b.pending == 0) fail("internal: ZeRO bucket of unit ", u, " marked ready before it was filled");
  if (ready_[u]) fail("internal: ZeRO unit ", u, " marked ready twice in one micro-step");
  ready_[u] = 1;
  if (--b.pending == 0) launch(bi);
}

void ReduceScatterBuckets::launch(size_t bi) {
  auto& b = buckets_[bi];
  auto& s = slots_[b.slot];
  s.work = dp_->reduce_scatter_async(s.send.narrow(0, 0, dp_->size() * b.numel), s.recv.narrow(0, 0, b.numel));
  s.launched_order = ++launches_;
  b.pending = b.units.size();  // the next micro-step fills it again
  for (size_t u : b.units) ready_[u] = 0;
}

void ReduceScatterBuckets::flush() {
  for (auto& b : buckets_) {
    if (b.pending == b.units.size() || b.slot < 0 || slots_[b.slot].work) continue;  // untouched, or launched
    // Partly filled: the units without gradients add zeros. Listed first, because the last one's
    // unit_ready launches the bucket and clears every unit's ready mark for the next micro-step.
    std::vector<size_t> missing;
    for (size_t u : b.units)
      if (!ready_[u]) missing.push_back(u);
    for (size_t u : missing) {
      send_rows(u).zero_();
      unit_ready(u);
    }
  }
  complete(true);
}

void ReduceScatterBuckets::finish(int slot) {
  auto& s = slots_[slot];
  s.work->wait();
  auto& b = buckets_[s.bucket];
  for (size_t u : b.units) deliver_(u, s.recv.narrow(0, offset_[u], shard_numel_[u]));
  s.work.reset();
  b.slot = -1;
  s.bucket = -1;
}

void ReduceScatterBuckets::complete(bool all) {
  for (;;) {  // oldest first, so deliveries keep the launch order
    int oldest = -1;
    for (size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].work && (oldest < 0 || slots_[s].launched_order < slots_[oldest].launched_order))
        oldest = static_cast<int>(s);
    if (oldest < 0) return;
    if (!all && !slots_[oldest].work->test()) return;
    finish(oldest);
  }
}

}  // namespace shardlm::parallel
