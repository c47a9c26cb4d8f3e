#include "parallel/zero/zero_gather_buckets.h"

#include <ATen/ATen.h>

#include <deque>

#include "util/error.h"

namespace shardlm::parallel {

AllGatherBuckets::AllGatherBuckets(std::vector<int64_t> shard_numel, int64_t cap, comm::CommPtr dp)
    : shard_numel_(std::move(shard_numel)), dp_(std::move(dp)) {
  if (cap <= 0) fail("zero_optimization.allgather_bucket_size must be positive, got ", cap);
  const int64_t n = dp_->size();
  for (size_t u = 0; u < shard_numel_.size(); ++u) {
    if (shard_numel_[u] == 0) continue;
    if (buckets_.empty() || n * (buckets_.back().numel + shard_numel_[u]) > cap) buckets_.push_back({});
    buckets_.back().units.push_back(u);
    buckets_.back().numel += shard_numel_[u];
  }
}

void AllGatherBuckets::gather(const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>& flats) const {
  const int64_t n = dp_->size();
  struct InFlight {
    const Bucket* bucket;
    at::Tensor send, recv;  // kept alive until the gather lands
    comm::WorkPtr work;
  };
  std::deque<InFlight> in_flight;
  // Copies a landed bucket's rows into its units.
  auto land = [&](InFlight& f) {
    f.work->wait();
    if (!f.recv.defined()) return;  // a single unit, gathered straight into its buffer
    const auto rows = f.recv.view({n, f.bucket->numel});
    int64_t at = 0;
    for (size_t u : f.bucket->units) {
      flats[u].view({n, shard_numel_[u]}).copy_(rows.narrow(1, at, shard_numel_[u]));
      at += shard_numel_[u];
    }
  };
  for (const auto& b : buckets_) {
    if (in_flight.size() == 2) {
      land(in_flight.front());
      in_flight.pop_front();
    }
    if (b.units.size() == 1) {  // straight into the unit (in place where the shard is a view of it)
      const size_t u = b.units[0];
      in_flight.push_back({&b, shards[u], at::Tensor(), dp_->all_gather_async(shards[u], flats[u])});
      continue;
    }
    // The shards are packed into this rank's own row of the receive buffer and gathered in place.
    auto recv = at::empty({n * b.numel}, flats[b.units[0]].options());
    auto send = recv.narrow(0, dp_->rank() * b.numel, b.numel);
    int64_t at = 0;
    for (size_t u : b.units) {
      send.narrow(0, at, shard_numel_[u]).copy_(shards[u]);
      at += shard_numel_[u];
    }
    in_flight.push_back({&b, send, recv, dp_->all_gather_async(send, recv)});
  }
  for (auto& f : in_flight) land(f);
}

}  // namespace shardlm::parallel
