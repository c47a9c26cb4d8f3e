// See consistency.h.
#include "parallel/consistency.h"

#include <ATen/ATen.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>

#include "parallel/model_split.h"
#include "parallel/strategy.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

uint64_t mix(uint64_t h, uint64_t word) {
  h ^= word + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0x100000001b3ULL;
}

uint64_t string_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = mix(h, c);
  return h;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Compares one set; returns the mismatch message ("" when all agree). Every rank of the group gets
// the same answer.
std::string compare(const ReplicaSet& set, int world_rank, int64_t step, const std::string& kind) {
  const int n = set.group->size();
  const int64_t m = static_cast<int64_t>(set.tensors.size());
  std::vector<int64_t> mine{world_rank, 0};
  uint64_t names = 0;
  for (const auto& [name, t] : set.tensors) {
    names = mix(names, string_hash(name));
    const uint64_t h = tensor_checksum(t);
    int64_t as_signed;
    std::memcpy(&as_signed, &h, sizeof h);
    mine.push_back(as_signed);
  }
  std::memcpy(&mine[1], &names, sizeof names);
  auto all = at::empty({n * (m + 2)}, at::kLong);
  set.group->all_gather(at::tensor(mine, at::kLong), all);
  const auto* a = all.data_ptr<int64_t>();
  auto at_rank = [&](int r, int64_t field) { return a[r * (m + 2) + field]; };
  for (int r = 1; r < n; ++r)
    if (at_rank(r, 1) != at_rank(0, 1))
      return "internal: the " + set.what + " group's ranks hold different tensor lists (world ranks " +
             std::to_string(at_rank(0, 0)) + " and " + std::to_string(at_rank(r, 0)) + ")";
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < m; ++i) {
    bool same = true;
    for (int r = 1; r < n; ++r) same = same && at_rank(r, i + 2) == at_rank(0, i + 2);
    if (!same && first < 0) first = i;
    differing += same ? 0 : 1;
  }
  if (first < 0) return "";
  // The ranks, grouped by their checksum of the first differing tensor.
  std::string by_value;
  std::vector<bool> done(n, false);
  for (int r = 0; r < n; ++r) {
    if (done[r]) continue;
    std::string ranks;
    for (int q = r; q < n; ++q)
      if (!done[q] && at_rank(q, first + 2) == at_rank(r, first + 2)) {
        done[q] = true;
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(at_rank(q, 0));
      }
    uint64_t h;
    const int64_t v = at_rank(r, first + 2);
    std::memcpy(&h, &v, sizeof h);
    by_value += (by_value.empty() ? "" : "; ") + std::string("world rank(s) ") + ranks + " hold checksum " + hex(h);
  }
  return "consistency check failed at step " + std::to_string(step) + ": " + kind + " differ across the " + set.what +
         " group; first differing tensor " + set.tensors[first].first + ": " + by_value + " (" +
         std::to_string(differing) + " of " + std::to_string(m) +
         " replicated tensors differ). Replicas that should be bit-identical have drifted apart: a rank computed or "
         "received something the others did not (nondeterministic kernel, a collective that is not bitwise the same "
         "everywhere, a rank-dependent code path).";
}

}  // namespace

uint64_t tensor_checksum(const at::Tensor& t) {
  const auto c = t.detach().to(at::kCPU).contiguous();
  uint64_t h = mix(static_cast<uint64_t>(c.scalar_type()), static_cast<uint64_t>(c.numel()));
  for (auto d : c.sizes()) h = mix(h, static_cast<uint64_t>(d));
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  const size_t nbytes = c.nbytes(), words = nbytes / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + 8 * words, nbytes - 8 * words);
  return mix(h, tail);
}

double check_consistency(Strategy& strategy, const comm::CommPtr& world, int64_t step, bool gradients) {
  const auto start = std::chrono::steady_clock::now();
  auto sets = strategy.replicated_tensors(gradients);
  const int me = world->rank();
  const std::string kind = gradients ? "gradients before the update" : "parameters after the update";
  std::string message;
  for (const auto& set : sets) {
    if (set.group->size() < 2) continue;
    const auto found = compare(set, me, step, kind);
    if (message.empty()) message = found;
  }
  // Every rank stops, with the message of the lowest world rank that found a difference.
  auto reporter = at::tensor({static_cast<int64_t>(message.empty() ? INT_MAX : me)}, at::kLong);
  world->all_reduce(reporter, comm::ReduceOp::Min);
  const int64_t who = reporter.item<int64_t>();
  if (who == INT_MAX) return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  constexpr int64_t kMaxMessage = 4096;
  auto text = at::zeros({kMaxMessage}, at::kByte);
  if (who == me) std::memcpy(text.data_ptr(), message.data(), std::min<size_t>(message.size(), kMaxMessage - 1));
  world->broadcast(text, static_cast<int>(who));
  throw Error(std::string(static_cast<const char*>(text.data_ptr())));
}

std::vector<ReplicaSet> split_replica_sets(const ModelSplit& split, const comm::CommPtr& dp,
                                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                           bool data_parallel, const comm::CommPtr& edp) {
  ReplicaSet over_edp{"expert-data-parallel (ranks holding the same experts)", edp, {}};
  ReplicaSet over_dp{"data-parallel", dp, {}}, over_tp{"tensor-parallel", split.tp ? split.tp->group() : nullptr, {}};
  const auto& tied = split.pp ? split.pp->tied_group() : nullptr;
  const bool tied_end = tied && (split.pp->stage() == 0 || split.pp->stage() == split.pp->stages() - 1);
  ReplicaSet over_tied{"tied-embedding (first and last pipeline stage)", tied, {}};
  // With more TP ranks than KV heads, each KV head is held by the TP ranks whose query heads read it.
  ReplicaSet over_kv{"KV-head (tensor-parallel ranks sharing a KV head)", split.tp ? split.tp->kv_group() : nullptr, {}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (!t.defined() || !split.holds(i)) continue;
    if (data_parallel) (split.is_expert(i) ? over_edp : over_dp).tensors.push_back(tensors[i]);
    const long replicas = split.tp ? std::lround(1.0 / split.tp->grad_norm_weights()[i]) : 1;
    if (split.tp && replicas == split.tp->size()) over_tp.tensors.push_back(tensors[i]);
    else if (replicas > 1 && over_kv.group && replicas == over_kv.group->size()) over_kv.tensors.push_back(tensors[i]);
    if (tied_end && i == 0) over_tied.tensors.push_back(tensors[i]);
  }
  std::vector<ReplicaSet> sets;
  for (auto* s : {&over_dp, &over_edp, &over_tp, &over_kv, &over_tied})
    if (s->group && !s->tensors.empty()) sets.push_back(std::move(*s));
  return sets;
}

}  // namespace shardlm::parallel
