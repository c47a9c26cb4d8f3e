// See zero_memory.h.
#include "parallel/zero/zero_memory.h"

#include <algorithm>

#include "parallel/zero/stage3_schedule.h"

namespace shardlm::parallel {
namespace {
// Bytes of one master element: ZeroBytes::master, or with bf16 masters the bf16 shard's (the compute dtype).
int64_t master_element(const ZeroBytes& b) { return b.masters == optim::MasterRounding::None ? b.master : b.compute; }
// The host optimizer casts its updated masters into a narrower buffer for the copy up (fp32 masters
// under 16-bit compute); bf16 masters go up as they are.
bool casts_masters(const ZeroBytes& b) { return b.compute < b.master && b.masters == optim::MasterRounding::None; }
}  // namespace

ModelStateMemory zero_state_bytes(const FlatLayout& layout, int stage, ZeroBytes b, double persistence_threshold,
                                  bool host_optimizer, bool states_on_disk, bool host_params) {
  ModelStateMemory m;
  for (const auto& u : layout.units) {
    const bool persistent = stage < 3 || !stage3_sharded(u, persistence_threshold);
    m.compute_params += ((persistent ? u.padded_numel : 0) + (stage == 3 ? u.shard_numel : 0)) * b.compute;
    m.gradients += stage <= 1 ? u.padded_numel * b.compute : u.shard_numel * b.gradient_shard;
    if (b.compute < 4 && b.masters == optim::MasterRounding::None) m.master_params += u.shard_numel * 4;
    m.padding_elements += u.padded_numel - u.numel;
  }
  const int ranks = b.states == optim::StatePrecision::Int8 ? layout.dp_size : 1;  // the others hold alike
  for (int r = 0; r < ranks; ++r) m.optimizer_states = std::max(m.optimizer_states, optimizer_state_bytes(layout, b, r));
  if (host_optimizer && states_on_disk) {
    m.offloaded = m.optimizer_states;
    for (const auto& u : layout.units) m.offloaded += u.shard_numel * master_element(b);
    m.host = host_staging_bytes(layout, stage, b, true);
    m.master_params = m.optimizer_states = 0;
  } else if (host_optimizer) {
    m.host = host_optimizer_bytes(layout, stage, b, m.optimizer_states);
    m.master_params = m.optimizer_states = 0;
  }
  if (host_params && stage == 3) {
    const auto moved = parameter_shards_to_host(layout, b, persistence_threshold, host_optimizer);
    m.compute_params += moved.compute_params;
    m.master_params += moved.master_params;
    m.host += moved.host;
  }
  return m;
}

ParamShardsToHost parameter_shards_to_host(const FlatLayout& layout, ZeroBytes b, double persistence_threshold,
                                           bool host_optimizer) {
  ParamShardsToHost d;
  const bool shard_is_master = !(b.compute < 4 && b.masters == optim::MasterRounding::None);
  for (const auto& u : layout.units) {
    if (!stage3_sharded(u, persistence_threshold)) continue;
    d.compute_params -= u.shard_numel * b.compute;
    if (host_optimizer) continue;  // the host shard is one of the host optimizer's own buffers (zero_memory.h)
    d.host += u.shard_numel * b.compute;
    if (shard_is_master) d.master_params += u.shard_numel * master_element(b);
  }
  return d;
}

int64_t host_optimizer_bytes(const FlatLayout& layout, int stage, ZeroBytes b, int64_t optimizer_states) {
  int64_t bytes = optimizer_states + host_staging_bytes(layout, stage, b, false);
  for (const auto& u : layout.units) bytes += u.shard_numel * master_element(b);
  return bytes;
}

int64_t host_staging_bytes(const FlatLayout& layout, int stage, ZeroBytes b, bool states_on_disk) {
  const int64_t per_element =
      (stage <= 1 ? b.compute : b.gradient_shard) + (casts_masters(b) || states_on_disk ? b.compute : 0);
  int64_t bytes = 0;
  for (const auto& u : layout.units) bytes += u.shard_numel * per_element;
  return bytes;
}

std::vector<char> stage3_offloaded_units(const FlatLayout& layout, double persistence_threshold, double max_in_cpu) {
  std::vector<char> out(layout.units.size(), 0);
  double kept = 0;  // shard elements left in host memory so far
  bool spilling = false;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const auto& unit = layout.units[u];
    if (!stage3_sharded(unit, persistence_threshold)) continue;
    spilling = spilling || kept + static_cast<double>(unit.shard_numel) > max_in_cpu;
    if (spilling) out[u] = 1;
    else kept += static_cast<double>(unit.shard_numel);
  }
  return out;
}

int64_t offloaded_parameter_bytes(const FlatLayout& layout, int64_t compute_bytes, double persistence_threshold,
                                  double max_in_cpu) {
  const auto off = stage3_offloaded_units(layout, persistence_threshold, max_in_cpu);
  int64_t bytes = 0;
  for (size_t u = 0; u < off.size(); ++u)
    if (off[u]) bytes += layout.units[u].shard_numel * compute_bytes;
  return bytes;
}

int64_t optimizer_state_bytes(const FlatLayout& layout, ZeroBytes b, int rank) {
  int64_t bytes = 0;
  const int64_t compensation = b.masters == optim::MasterRounding::Kahan ? 2 : 0;  // bf16, per element
  for (const auto& u : layout.units) {
    if (b.states != optim::StatePrecision::Int8) {
      bytes += 2 * u.shard_numel * (b.states == optim::StatePrecision::BF16 ? 2 : b.master) + compensation * u.shard_numel;
      continue;
    }
    const int64_t S = u.shard_numel;
    for (const auto& p : u.params) {
      const int64_t lo = std::max(p.offset, rank * S), hi = std::min(p.offset + p.numel, (rank + 1) * S);
      if (lo >= hi) continue;
      bytes += compensation * (hi - lo);
      if (p.numel < b.min_8bit_size) bytes += 2 * (hi - lo) * b.master;
      else bytes += 2 * (hi - lo) + 2 * 4 * optim::blocks_touched(lo - p.offset, hi - lo);
    }
  }
  return bytes;
}

}  // namespace shardlm::parallel
