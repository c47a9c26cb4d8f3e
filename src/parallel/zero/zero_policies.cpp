// See zero_policies.h.
#include "parallel/zero/zero_policies.h"

namespace shardlm::parallel {

ModelStateMemory policy_memory(const FlatLayout& layout, const ZeroPolicies& p, ZeroBytes bytes,
                               double persistence_threshold, double max_in_cpu) {
  auto m = zero_state_bytes(layout, p.stage, bytes, persistence_threshold, p.states_apart,
                            p.states_apart && p.states == StatePlacement::Nvme, p.params_apart);
  if (p.params_nvme) {  // the shards beyond max_in_cpu live in their files
    const int64_t b = offloaded_parameter_bytes(layout, bytes.compute, persistence_threshold, max_in_cpu);
    (p.params_apart ? m.host : m.compute_params) -= b;
    m.offloaded += b;
  }
  return m;
}

}  // namespace shardlm::parallel
