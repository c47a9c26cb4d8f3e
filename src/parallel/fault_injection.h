// Faults that tests inject into a parallel run, behind one seam: a test sets them on the rank(s) it
// wants with a FaultScope, and parallelize() (the one place that reads them) then wraps what it
// builds — the data-parallel communicator and the Strategy — in decorators that inject them
// (fault_injection.cpp). The engines themselves hold no fault checks, and a run without faults
// (every normal run: nothing outside tests sets them, and they are not in TrainConfig) gets the
// strategy undecorated.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/llama.h"
#include "parallel/parallel_dims.h"
#include "parallel/strategy.h"

namespace shardlm::parallel {

struct FaultInjection {
  // This data-parallel rank sleeps before starting each all-gather over its data-parallel group
  // (ZeRO-3's parameter gathers among them), so the others read a prefetched buffer long before
  // its data could have arrived unless they wait for it.
  int delay_gather_rank = -1;
  int delay_gather_ms = 0;
  // This data-parallel rank writes an inf into its gradient shard of unit 1 at this (0-based)
  // optimizer step, just before the fp16 overflow check reads it, so only it sees the overflow
  // locally (mixed-precision ZeRO strategies).
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

  // Whether anything is injected (the defaults inject nothing).
  bool any() const { return delay_gather_rank >= 0 || overflow_rank >= 0 || attenuate_unit >= 0 || perturb_rank >= 0; }
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

// The seam, called by parallelize(): returns build(dims) when no fault is injected; otherwise
// builds the strategy over `dims` with its data-parallel communicator wrapped (delayed gathers) and
// returns it wrapped in a Strategy decorator (overflow, attenuation, perturbation) over `model`.
std::unique_ptr<Strategy> with_injected_faults(
    model::Llama& model, const ParallelDims& dims,
    const std::function<std::unique_ptr<Strategy>(const ParallelDims&)>& build);

}  // namespace shardlm::parallel
