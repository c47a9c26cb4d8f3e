// Faults that tests inject into the parallel engines, kept out of the production configuration
// (TrainConfig, ZeroOptions): a test sets them on the rank(s) it wants, runs, and resets them with
// a FaultScope. Nothing in a normal run sets them; the defaults inject nothing.
#pragma once
#include <cstdint>
#include <string>

namespace shardlm::parallel {

struct FaultInjection {
  // This data-parallel rank sleeps before starting each ZeRO-3 parameter all-gather, so the others
  // read a prefetched buffer long before its data could have arrived unless they wait for it.
  int delay_gather_rank = -1;
  int delay_gather_ms = 0;
  // This data-parallel rank writes an inf into its gradient shard of unit 1 at this (0-based)
  // optimizer step, so only it sees the overflow locally.
  int overflow_rank = -1;
  int64_t overflow_step = -1;
  // The backward signal leaving this unit's output is multiplied by `attenuation`, giving that unit
  // (and those below it) gradients that are tiny but well defined.
  int attenuate_unit = -1;
  double attenuation = 1.0;
  // This world rank moves the first element of `perturb_tensor` (an HF name, as the replica sets of
  // parallel/consistency.h name it) up by one ulp at this (0-based) optimizer step, just before the
  // consistency check reads it: its gradient (perturb_gradient) or, after the update, its parameter.
  int perturb_rank = -1;
  int64_t perturb_step = -1;
  std::string perturb_tensor;
  bool perturb_gradient = false;
};

// The process's injected faults (none unless a test set them).
inline FaultInjection& injected_faults() {
  static FaultInjection faults;
  return faults;
}

// Sets faults for a scope and clears them when it ends.
class FaultScope {
 public:
  explicit FaultScope(const FaultInjection& f) { injected_faults() = f; }
  ~FaultScope() { injected_faults() = FaultInjection{}; }
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;
};

}  // namespace shardlm::parallel
