// See zero_memory.h.
#include "parallel/zero/zero_memory.h"

#include "parallel/zero/stage3_schedule.h"

namespace shardlm::parallel {

ModelStateMemory zero_state_bytes(const FlatLayout& layout, int stage, ZeroBytes b, double persistence_threshold) {
  ModelStateMemory m;
  for (const auto& u : layout.units) {
    const bool persistent = stage < 3 || !stage3_sharded(u, persistence_threshold);
    m.compute_params += ((persistent ? u.padded_numel : 0) + (stage == 3 ? u.shard_numel : 0)) * b.compute;
    m.gradients += stage <= 1 ? u.padded_numel * b.compute : u.shard_numel * b.gradient_shard;
    if (b.compute < 4) m.master_params += u.shard_numel * 4;
    m.optimizer_states += 2 * u.shard_numel * b.master;
    m.padding_elements += u.padded_numel - u.numel;
  }
  return m;
}

}  // namespace shardlm::parallel
