#include "parallel/parallel_dims.h"

#include "util/error.h"

namespace shardlm::parallel {

ParallelDims ParallelDims::build(comm::CommPtr world, int dp, int tp, int pp) {
  const int n = world->size();
  if (tp < 1 || pp < 1 || dp < 0) fail("parallel sizes must be positive: dp=", dp, " tp=", tp, " pp=", pp);
  if (dp == 0) {
    if (n % (tp * pp) != 0)
      fail("world size ", n, " is not divisible by tp x pp = ", tp, " x ", pp, "; launch a multiple of ", tp * pp,
           " ranks");
    dp = n / (tp * pp);
  }
  if (dp * tp * pp != n)
    fail("dp x tp x pp = ", dp, " x ", tp, " x ", pp, " = ", dp * tp * pp, " but the job has ", n,
         " ranks; change the sizes or the number of ranks (--nproc)");
  ParallelDims d;
  d.dp = dp;
  d.tp = tp;
  d.pp = pp;
  d.world = world;
  const int r = world->rank();
  const int tp_rank = r % tp, dp_rank = (r / tp) % dp, pp_rank = r / (tp * dp);
  // Colors identify the group; keys order ranks inside it.
  d.tp_comm = tp == 1 && n == 1 ? world : world->split(pp_rank * dp + dp_rank, tp_rank, "tp");
  d.dp_comm = dp == n ? world : world->split(pp_rank * tp + tp_rank, dp_rank, "dp");
  d.pp_comm = world->split(dp_rank * tp + tp_rank, pp_rank, "pp");
  return d;
}

}  // namespace shardlm::parallel
