// The model-state bytes one rank holds under ZeRO, from the flat layout: the one formula both the
// engine (memory.json, checked against its real buffers when it is built) and the planner
// (predictions for models never allocated) use, so the two cannot drift apart.
//   compute parameters: every persistent unit whole (stage 3: only units under the persistence
//                       threshold), plus stage 3's own shard of every unit;
//   gradients:          stage 0-1 the whole unit in the compute dtype, stage 2-3 the shard in the
//                       gradient-accumulation dtype;
//   fp32 master:        the shard, only when compute is 16-bit (otherwise the shard is the master)
//                       and the masters are not bf16 (optimizer.master_precision: the bf16 shard is
//                       the master, optim/master_format.h);
//   Adam moments:       two per shard element, in the master's dtype; with compact states
//                       (optimizer.state_precision, optim/quantized_state.h) two bf16 per element, or
//                       for 8-bit one byte per element and moment plus two float32 absmax per
//                       quantization block the rank's slice of a parameter touches (fp32 moments for
//                       parameters under min_8bit_size). 8-bit bytes differ between ranks (where
//                       slices cut blocks): the formula gives the most any rank holds. Kahan
//                       summation over bf16 masters adds its bf16 compensation (2 bytes per element).
// Stage 0 (mixed precision; fp32 DDP holds the same bytes) is a layout over one rank: the shard is
// the whole unit.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/master_format.h"
#include "optim/quantized_state.h"
#include "parallel/strategy.h"
#include "parallel/zero/flat_layout.h"

namespace shardlm::parallel {

struct ZeroBytes {
  int64_t compute = 4;          // element size of parameters/activations (2 for bf16/fp16)
  int64_t gradient_shard = 4;   // element size of the persistent gradient shard (stages 2-3)
  int64_t master = 4;           // element size of the master weights and Adam moments (8 in fp64 tests)
  optim::StatePrecision states = optim::StatePrecision::FP32;  // how the Adam moments are kept
  int64_t min_8bit_size = optim::kDefaultMin8bitSize;
  optim::MasterRounding masters = optim::MasterRounding::None;  // None: fp32 masters; else bf16 masters
};

// The Adam moment bytes shard `rank` of `layout` holds (fp32 and bf16: a whole shard each, padding
// included, as every rank is counted alike; 8-bit: exactly what that rank's slices hold).
int64_t optimizer_state_bytes(const FlatLayout& layout, ZeroBytes bytes, int rank);

// `layout` must be built over the ranks the units are sharded across (1 for stage 0).
// host_optimizer: offload_optimizer cpu with the host buffers apart from the device's (a GPU run;
// host_optimizer.h): master_params and optimizer_states are 0 (nothing of them on the device) and
// `host` holds host_optimizer_bytes. states_on_disk (with host_optimizer: offload_optimizer nvme on a
// GPU run, whose masters and moments stream from files through the host): the masters (one per shard
// element, ZeroBytes::master; bf16 masters 2) and moments (with Kahan's compensation) are `offloaded`, and
// `host` holds only host_staging_bytes.
// host_params: parameter offload apart from the device (parameter_shards_to_host, stage 3; with
// host_optimizer the host shards are buffers it already counts).
ModelStateMemory zero_state_bytes(const FlatLayout& layout, int stage, ZeroBytes bytes, double persistence_threshold,
                                  bool host_optimizer = false, bool states_on_disk = false, bool host_params = false);

// The host memory of offload_optimizer cpu with its buffers apart from the device's, per unit shard
// (padding included): the master (ZeroBytes::master; bf16 masters: the compute dtype's 2 bytes),
// `optimizer_states` bytes of moments (and Kahan's compensation), a gradient buffer the reduced gradient shard is
// copied into (compute dtype at stage 1, the gradient-accumulation dtype at 2-3), and where the
// compute dtype is narrower than an fp32 master a buffer the cast parameters wait in for the copy up.
int64_t host_optimizer_bytes(const FlatLayout& layout, int stage, ZeroBytes bytes, int64_t optimizer_states);
// Its staging buffers alone: the gradient buffer and the cast buffer, which with states_on_disk every
// run has (the updated master is in a chunk buffer the next chunk reuses; it goes up from this one).
int64_t host_staging_bytes(const FlatLayout& layout, int stage, ZeroBytes bytes, bool states_on_disk);

// Parameter offload (zero_optimization.offload_param.device "nvme", stage 3; param_offload.h): per unit,
// 1 where its compute-dtype shard lives in a file. Only units that exist as shards between uses
// (stage3_sharded) qualify; as DeepSpeed's max_in_cpu, the first of them whose shard elements add up to
// at most max_in_cpu stay in host memory.
std::vector<char> stage3_offloaded_units(const FlatLayout& layout, double persistence_threshold, double max_in_cpu);
// Parameter offload apart from the device (zero_engine.h offload_param_apart, stage 3): the bytes it
// adds to each line (compute_params: negative). Every sharded unit's compute shard leaves the device for
// host memory. Without the host optimizer an fp32 shard was its own master, which now stays on the
// device beside the moments (as DeepSpeed keeps them). With it (host_optimizer_bytes, or
// host_staging_bytes under NVMe states) the host shard is one of the buffers it holds anyway, so it adds
// no host bytes: where it has the master's dtype (fp32 compute, bf16 masters) it is the host master
// itself, one buffer (with NVMe parameters, the master lives in the parameter files); otherwise (fp32
// masters under 16-bit compute, and NVMe states, whose paged masters are cast into it) it is the buffer
// the cast parameters go up from, so no staging buffer is allocated for it.
struct ParamShardsToHost {
  int64_t compute_params = 0, master_params = 0, host = 0;
};
ParamShardsToHost parameter_shards_to_host(const FlatLayout& layout, ZeroBytes bytes, double persistence_threshold,
                                           bool host_optimizer);
// Those units' shard bytes: the engine and the planner move them from compute_params (apart: from host)
// to offloaded.
int64_t offloaded_parameter_bytes(const FlatLayout& layout, int64_t compute_bytes, double persistence_threshold,
                                  double max_in_cpu);

}  // namespace shardlm::parallel
