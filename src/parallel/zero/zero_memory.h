// The model-state bytes one rank holds under ZeRO, from the flat layout: the one formula both the
// engine (memory.json, checked against its real buffers when it is built) and the planner
// (predictions for models never allocated) use, so the two cannot drift apart.
//   compute parameters: every persistent unit whole (stage 3: only units under the persistence
//                       threshold), plus stage 3's own shard of every unit;
//   gradients:          stage 0-1 the whole unit in the compute dtype, stage 2-3 the shard in the
//                       gradient-accumulation dtype;
//   fp32 master:        the shard, only when compute is 16-bit (otherwise the shard is the master);
//   Adam moments:       two per shard element, in the master's dtype.
// Stage 0 (mixed precision; fp32 DDP holds the same bytes) is a layout over one rank: the shard is
// the whole unit.
#pragma once
#include <cstdint>

#include "parallel/strategy.h"
#include "parallel/zero/flat_layout.h"

namespace shardlm::parallel {

struct ZeroBytes {
  int64_t compute = 4;          // element size of parameters/activations (2 for bf16/fp16)
  int64_t gradient_shard = 4;   // element size of the persistent gradient shard (stages 2-3)
  int64_t master = 4;           // element size of the master weights and Adam moments (8 in fp64 tests)
};

// `layout` must be built over the ranks the units are sharded across (1 for stage 0).
ModelStateMemory zero_state_bytes(const FlatLayout& layout, int stage, ZeroBytes bytes, double persistence_threshold);

}  // namespace shardlm::parallel
