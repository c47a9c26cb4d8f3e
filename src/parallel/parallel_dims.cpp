#include "parallel/parallel_dims.h"

#include "util/error.h"

namespace shardlm::parallel {

ParallelDims ParallelDims::build(comm::CommPtr world, int dp, int tp, int pp, int shard, int ep, int cp) {
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
  if (cp < 1) fail("parallelism.context_parallel must be >= 1 (1: no context parallelism), got ", cp);
  if (dp % cp != 0)
    fail("context parallelism: parallelism.context_parallel = ", cp, " does not divide the ", dp,
         " ranks left beside tp x pp; launch a multiple of ", cp * tp * pp, " ranks or change context_parallel");
  d.cp = cp;
  // The cp ranks are data-parallel ones: ZeRO, hybrid shard groups and expert-parallel groups form
  // over dp x cp as over any data-parallel ranks (their gradients are averaged over all of them).
  if (cp > 1) d.cp_comm = d.dp_comm->split(dp_rank / cp, dp_rank % cp, "cp");
  if (shard < 0) fail("the shard group size must be >= 0 (0: shard over every data-parallel rank), got ", shard);
  d.shard = shard == 0 ? dp : shard;
  if (dp % d.shard != 0)
    fail("hybrid sharding: a shard group of ", d.shard, " data-parallel ranks does not divide the ", dp,
         " data-parallel ranks; set parallelism.shard_group_size to a divisor of ", dp,
         " (or launch a multiple of ", d.shard, " x tp x pp ranks)");
  if (d.hybrid()) {
    const int shard_rank = dp_rank % d.shard, replica = dp_rank / d.shard;
    d.shard_comm = d.dp_comm->split(replica, shard_rank, "shard");
    d.replica_comm = d.dp_comm->split(shard_rank, replica, "replica");
  } else {
    d.shard_comm = d.dp_comm;
  }
  if (ep < 1) fail("parallelism.expert_parallel must be >= 1 (1: no expert parallelism), got ", ep);
  if (dp % ep != 0)
    fail("expert parallelism: parallelism.expert_parallel = ", ep, " does not divide the ", dp,
         " data-parallel ranks (expert-parallel ranks are carved out of them); set it to a divisor of ", dp,
         " or launch a multiple of ", ep, " x tp x pp ranks");
  d.ep = ep;
  d.edp_comm = d.dp_comm;
  if (ep > 1) {
    if (d.hybrid() && d.shard % ep != 0)
      fail("expert parallelism (parallelism.expert_parallel = ", ep, ") with hybrid sharding: an expert-parallel "
           "group must lie inside one shard group of ", d.shard, " data-parallel ranks, and ", ep, " does not divide ",
           d.shard, "; set parallelism.shard_group_size (or zero_optimization.mics_shard_size) to a multiple of ", ep,
           " or expert_parallel to a divisor of it");
    const int ep_rank = dp_rank % ep, edp_rank = dp_rank / ep;
    d.ep_comm = d.dp_comm->split(edp_rank, ep_rank, "ep");
    d.edp_comm = d.dp_comm->split(ep_rank, edp_rank, "edp");  // one rank when ep = dp
    if (d.hybrid()) {  // the experts' shard group: this replica's edp ranks; their replicas: the rest
      const int replica = dp_rank / d.shard, eshard_rank = (dp_rank % d.shard) / ep;
      d.eshard_comm = d.edp_comm->split(replica, eshard_rank, "edp_shard");
      d.ereplica_comm = d.edp_comm->split(eshard_rank, replica, "edp_replica");
    }
  }
  return d;
}

}  // namespace shardlm::parallel
