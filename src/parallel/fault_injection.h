// Faults that tests inject into a parallel run, behind one seam: a test sets them on the rank(s) it
// wants with a FaultScope, and parallelize() (the one place that reads them) then wraps what it
// builds — the data-parallel communicator and the Strategy — in decorators that inject them
// (fault_injection.cpp). The engines themselves hold no fault checks, and a run without faults
// (every normal run: nothing outside tests sets them, and they are not in TrainConfig) gets the
// strategy undecorated. One fault, the desync, can also reach a `shardlm train` run from the
// test-only environment variable SHARDLM_TEST_DESYNC (read by with_injected_faults and nowhere
// else; see desync_from_environment), for the end-to-end test of the flight recorder.
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

  // This data-parallel rank breaks the order of collectives on its data-parallel communicator at
  // the `desync_occurrence`-th (1-based) collective it issues there while its flight-record phase
  // (comm::FlightContext, e.g. "train / backward micro 0 / reduce-scatter layers.0") contains
  // `desync_phase` ("" matches every collective):
  //   "skip": it leaves that collective out and goes on to its next one on that communicator;
  //   "size": it calls that collective on the first half of its elements (a shorter view of the
  //           same buffers: nothing is read or written past them, on either side).
  // Either way the rank then holds: its mismatched call is issued (and recorded) but never
  // completed, as a rank of a desynchronised NCCL job waits in it, so its peers time out, every
  // rank writes its flight record and `shardlm diagnose` names the desync. (Left to the CPU
  // backends the mismatch would not end the job usefully: the shared-memory path pairs the two
  // calls and returns wrong numbers, each rank staying inside its own buffers and the fixed slots;
  // OpenMPI aborts the whole job on MPI_ERR_TRUNCATE in the rank that posted fewer elements, before
  // any rank can write a record.) It exits non-zero on its own if nobody ends the job first.
  int desync_rank = -1;
  std::string desync_kind;  // "skip" | "size"
  std::string desync_phase;
  int desync_occurrence = 1;

  // Whether anything is injected (the defaults inject nothing).
  bool any() const {
    return delay_gather_rank >= 0 || overflow_rank >= 0 || attenuate_unit >= 0 || perturb_rank >= 0 || desync_rank >= 0;
  }
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

// Test only: fills the desync fields from SHARDLM_TEST_DESYNC when it is set, a comma-separated
// list "rank=R,kind=skip|size[,phase=TEXT][,occurrence=N]" (e.g.
// "rank=1,kind=size,phase=reduce-scatter layers.0,occurrence=2"); refuses anything else. The one
// way a test reaches a fault in a `shardlm train` run: mpirun passes the variable to every rank.
void desync_from_environment(FaultInjection& faults);

// The seam, called by parallelize(): returns build(dims) when no fault is injected; otherwise
// builds the strategy over `dims` with its data-parallel communicator wrapped (delayed gathers,
// desync) and
// returns it wrapped in a Strategy decorator (overflow, attenuation, perturbation) over `model`.
std::unique_ptr<Strategy> with_injected_faults(
    model::Llama& model, const ParallelDims& dims,
    const std::function<std::unique_ptr<Strategy>(const ParallelDims&)>& build);

}  // namespace shardlm::parallel
