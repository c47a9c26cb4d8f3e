// The one topology object: validates dp x tp x pp = world size and builds every sub-communicator
// once. Everything that needs a group of ranks asks it rather than splitting communicators itself.
// Rank layout (innermost first): tp, then dp, then pp — tensor-parallel peers are adjacent ranks,
// which on a multi-node job keeps their heavy traffic inside a node.
#pragma once
#include "comm/communicator.h"

namespace shardlm::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1;
  comm::CommPtr world, dp_comm, tp_comm, pp_comm;

  // dp = 0 means "whatever is left": world / (tp * pp).
  static ParallelDims build(comm::CommPtr world, int dp, int tp, int pp);
  int dp_rank() const { return dp_comm->rank(); }
  bool is_logging_rank() const { return world->rank() == 0; }
};

}  // namespace shardlm::parallel
