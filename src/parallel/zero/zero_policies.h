// A ZeRO stage is a choice of three policies, and this file is where the choice is made: the one
// function that maps a stage and its offload keys to the policies, which the engine composes
// (zero_engine.h) and the planner asks for its memory (plan/model_states.cpp), so that the plan and
// the measured memory.json are the same sum by construction.
//   parameter residency (parameter_residency.h): replicated (stages 0-2) or sharded (stage 3), its
//       shards optionally in NVMe files (offload_param "nvme") or host memory apart from the device;
//   gradient reduction (gradient_reduction.h): all-reduce at the boundary (stage 0), reduce-scatter
//       in the backward of the accumulation's last micro-step (stage 1) or of every micro-step
//       (stages 2, 3), in reduce_bucket_size buckets;
//   optimizer-state placement (state_placement.cpp): fp32 masters and moments on the device, in host
//       memory (offload_optimizer "cpu", the host optimizer) or in NVMe files (offload_optimizer
//       "nvme"), and, on a device apart from the host, the host buffers between them.
// policy_memory gives each policy's bytes from the same flat layout (zero_memory.h).
#pragma once
#include "parallel/strategy.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_memory.h"

namespace shardlm::parallel {

enum class ParamResidency { Replicated, Sharded };
enum class GradReduction { AllReduceAtBoundary, ReduceScatterLastMicroStep, ReduceScatterEveryMicroStep };
enum class StatePlacement { Device, Host, Nvme };

// The offload keys a stage is combined with (zero_optimization.offload_optimizer / offload_param).
struct OffloadChoice {
  bool states_cpu = false, states_nvme = false;
  bool host_apart = false;  // the host optimizer's buffers apart from the device's (a GPU run)
  bool params_nvme = false, params_apart = false;
};

struct ZeroPolicies {
  int stage = 1;
  ParamResidency params = ParamResidency::Replicated;
  bool params_nvme = false;   // sharded units' shards in NVMe files
  bool params_apart = false;  // sharded units' shards in host memory apart from the device
  GradReduction grads = GradReduction::ReduceScatterLastMicroStep;
  StatePlacement states = StatePlacement::Device;
  bool states_apart = false;  // host or NVMe states through host buffers apart from the device
};

// Whether each rank steps only its shard of the optimizer: every reduction but stage 0's all-reduce
// leaves a rank the gradients of its shard alone, so its masters and moments are that shard's.
inline bool steps_a_shard(GradReduction g) { return g != GradReduction::AllReduceAtBoundary; }
// Whether the gradients are reduced in every micro-step's backward (and so held as a shard between
// them) rather than once, in the backward of the accumulation's last micro-step.
inline bool reduces_every_micro_step(GradReduction g) { return g == GradReduction::ReduceScatterEveryMicroStep; }

// The stage as a choice of policies. Stage 0 shards nothing and offloads nothing (its states are
// the device's, which on a CPU run is host memory already).
inline ZeroPolicies zero_policies(int stage, const OffloadChoice& o) {
  ZeroPolicies p;
  p.stage = stage;
  p.params = stage == 3 ? ParamResidency::Sharded : ParamResidency::Replicated;
  p.params_nvme = stage == 3 && o.params_nvme;
  p.params_apart = stage == 3 && o.params_apart;
  p.grads = stage == 0   ? GradReduction::AllReduceAtBoundary
            : stage == 1 ? GradReduction::ReduceScatterLastMicroStep
                         : GradReduction::ReduceScatterEveryMicroStep;
  p.states = stage == 0        ? StatePlacement::Device
             : o.states_nvme  ? StatePlacement::Nvme
             : o.states_cpu   ? StatePlacement::Host
                              : StatePlacement::Device;
  p.states_apart = p.states != StatePlacement::Device && o.host_apart;
  return p;
}

// The model-state bytes one rank holds under `policies`, over `layout` (built over the ranks the
// units are sharded across; one for stage 0): compute parameters by the residency (NVMe shards
// beyond max_in_cpu on disk, shards apart in host memory), gradients by the reduction, masters and
// moments by the placement (host: the host optimizer's buffers; NVMe apart: on disk, the host holding
// the staging buffers). The engine's memory() and the planner's held_model_states are this sum; NVMe
// states on the device's own memory then leave the resident lines by states_to_disk.
ModelStateMemory policy_memory(const FlatLayout& layout, const ZeroPolicies& policies, ZeroBytes bytes,
                               double persistence_threshold, double max_in_cpu);

// NVMe states: masters and moments leave the resident lines for the disk (the engine's memory();
// the planner after it scales a rank's bytes, plan/planner.cpp).
template <class Memory>
void states_to_disk(Memory& m) {
  m.offloaded += m.master_params + m.optimizer_states;
  m.master_params = m.optimizer_states = 0;
}

}  // namespace shardlm::parallel
