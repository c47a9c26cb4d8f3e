// The one topology object: validates dp x tp x pp = world size and builds every sub-communicator
// once. Everything that needs a group of ranks asks it rather than splitting communicators itself.
// Rank layout (innermost first): tp, then dp, then pp — world rank r has tp rank r % tp, dp rank
// (r / tp) % dp and pipeline stage r / (tp dp). Tensor-parallel peers are adjacent ranks, which on a
// multi-node job keeps their heavy traffic (4 all-reduces per layer) inside a node; pipeline stages
// are furthest apart (only activations cross between them). Sub-communicators, each ordered by its
// own rank:
//   tp_comm  the tp ranks of one (dp, pp) position: f/g collectives, vocab-parallel loss
//   dp_comm  the dp ranks of one (tp, pp) position: DDP all-reduce, ZeRO reduce-scatter/all-gather
//   pp_comm  the stages of one (dp, tp) position: activations and gradients between stages
// e.g. 8 ranks = dp 2 x tp 2 x pp 2: tp groups {0,1} {2,3} {4,5} {6,7}, dp groups {0,2} {1,3}
// {4,6} {5,7}, pipelines {0,4} {1,5} {2,6} {3,7}.
// Hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed's MiCS) splits the data-parallel ranks once more:
// dp = replicas x shard, the shard index innermost (dp rank = replica * shard + shard rank), so a
// shard group is `shard` consecutive dp ranks — on one node when tp x shard ranks fit it:
//   shard_comm    the dp ranks of one replica: ZeRO's reduce-scatter and all-gathers, the shards
//   replica_comm  the dp ranks holding the same shard, one per replica: the shard's gradient all-reduce
// e.g. dp 4 in shards of 2: shard groups {0,1} {2,3}, replica groups {0,2} {1,3}. Without hybrid
// sharding shard = dp, shard_comm is dp_comm and there is no replica_comm. The rank order, innermost
// first, is fixed here for every group: tp, shard, replica (together dp), pp.
// Expert parallelism (parallel/expert/, Megatron-Core's and DeepSpeed-MoE's layout) carves the
// expert-parallel ranks out of the data-parallel ones: ep divides dp, and the ep ranks of one group
// are consecutive dp ranks (dp rank = edp rank * ep + ep rank), so their token all_to_alls stay on
// the fewest nodes:
//   ep_comm   the ep consecutive dp ranks that together hold every expert of a layer (E/ep each):
//             the token dispatch and combine all_to_alls
//   edp_comm  the dp/ep dp ranks holding the same experts, one per expert-parallel group: the
//             expert gradients' all-reduce (DDP) or the expert units' sharding (ZeRO)
// e.g. dp 4 with ep 2: ep groups {0,1} {2,3}, edp groups {0,2} {1,3} (dp ranks). Everything that is
// not an expert stays replicated over ep and is averaged over all of dp as without it. Without
// expert parallelism ep = 1, ep_comm is null and edp_comm is dp_comm.
// With hybrid sharding an EP group lies inside one shard group (ep divides shard), so the rank order
// is tp, ep, (shard / ep), replica, pp; the experts' ZeRO engine shards over the edp ranks of its
// replica and all-reduces across replicas:
//   eshard_comm    the shard / ep edp ranks of one replica (the experts' shard group)
//   ereplica_comm  the edp ranks holding the same expert shard, one per replica
// e.g. dp 4 in shards of 2 with ep 2: ep groups {0,1} {2,3}, edp {0,2} {1,3}, eshard {0} {2} {1}
// {3}, ereplica {0,2} {1,3} (dp ranks).
// With tensor and pipeline parallelism the one rank order, innermost first, is tp, ep, edp (ep x
// edp = dp), pp: each (tp, pp) position has its own EP groups, whose ranks hold the same attention
// shards and stage (the sparse block is replicated over tp, parallel/tensor/tp_layout.h), e.g. 8
// ranks = tp 2 x dp 2 (ep 2) x pp 2: ep groups {0,2} {1,3} {4,6} {5,7} (world ranks), each with an
// edp group of one.
// Context parallelism (parallel/context/) splits every sequence over cp ranks that sit between tp
// and the data-parallel ranks, rank order tp, cp, dp, pp (world rank r: cp rank (r / tp) % cp).
// The cp ranks of one data position read the same sequences (their chunks of them) and join the
// data-parallel group the gradients are averaged over, as torchtitan's FSDP over dp x cp: `dp`,
// dp_comm and everything built on them (DDP, ZeRO, hybrid sharding) span dp x cp ranks, while the
// data loader reads as data_ranks() ranks:
//   cp_comm   the cp consecutive dp_comm ranks holding one sequence's chunks: the K/V exchange
// e.g. 4 ranks = cp 2 x dp 2: cp groups {0,1} {2,3}, dp_comm {0,1,2,3}, data ranks 0 {0,1} and 1 {2,3}.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>
#include "comm/communicator.h"

namespace shardlm::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1;
  int shard = 1;  // data-parallel ranks one ZeRO shard group spans (= dp without hybrid sharding)
  int ep = 1;     // expert-parallel ranks (a divisor of dp); 1: every rank holds every expert
  int cp = 1;     // context-parallel ranks (a divisor of dp, which counts them); 1: whole sequences
  comm::CommPtr world, dp_comm, tp_comm, pp_comm;
  comm::CommPtr cp_comm;                   // context parallelism only, else null
  comm::CommPtr shard_comm, replica_comm;  // replica_comm: hybrid sharding only, else null
  comm::CommPtr ep_comm, edp_comm;         // ep_comm: expert parallelism only, else null
  comm::CommPtr eshard_comm, ereplica_comm;  // expert parallelism with hybrid sharding only, else null

  // dp = 0 means "whatever is left": world / (tp * pp). shard = 0: no hybrid sharding (shard = dp);
  // else it must divide dp. ep: expert-parallel ranks, a divisor of dp (1: none).
  // cp: context-parallel ranks; dp (given or left) then counts dp x cp ranks.
  static ParallelDims build(comm::CommPtr world, int dp, int tp, int pp, int shard = 0, int ep = 1, int cp = 1);
  int dp_rank() const { return dp_comm->rank(); }
  // What the data loader reads as: its rank and ranks (the cp ranks of one position read the same).
  int data_rank() const { return dp_rank() / cp; }
  int data_ranks() const { return dp / cp; }
  int cp_rank() const { return cp_comm ? cp_comm->rank() : 0; }
  bool expert_parallel() const { return ep > 1; }
  int ep_rank() const { return ep_comm ? ep_comm->rank() : 0; }
  bool hybrid() const { return shard < dp; }
  int replicas() const { return dp / shard; }
  bool is_logging_rank() const { return world->rank() == 0; }
  // The layout a checkpoint records (train/checkpoint.h): world, dp, tp, pp, with the run's ZeRO
  // stage and compute dtype. grid_text names a recorded layout's grid and ZeRO stage (what a
  // reshard changes), e.g. "dp=2 tp=1 pp=1 ZeRO 3".
  nlohmann::json layout_json(int zero_stage, const std::string& dtype) const {
    nlohmann::json j = {{"world", world->size()}, {"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero_stage", zero_stage},
                        {"dtype", dtype}};
    if (hybrid()) j["shard"] = shard;
    if (expert_parallel()) j["ep"] = ep;
    if (cp > 1) j["cp"] = cp;
    return j;
  }
  static std::string grid_text(const nlohmann::json& l) {
    return "dp=" + l.at("dp").dump() + (l.contains("shard") ? " (shards of " + l.at("shard").dump() + ")" : "") +
           (l.contains("ep") ? " ep=" + l.at("ep").dump() : "") + (l.contains("cp") ? " cp=" + l.at("cp").dump() : "") +
           " tp=" + l.at("tp").dump() +
           " pp=" + l.at("pp").dump() + " ZeRO " + l.at("zero_stage").dump();
  }
  // The groups whose traffic a step's metrics record, with their prefix: data parallel as comm_,
  // tensor parallel as comm_tp_, pipeline as comm_pp_, and with hybrid sharding the shard groups as
  // comm_shard_ and the replica groups (the traffic between shard groups) as comm_replica_ (only the
  // groups the layout has); with expert parallelism the token all_to_alls as comm_ep_ and the expert
  // gradients' group as comm_edp_.
  std::vector<std::pair<std::string, comm::CommPtr>> metric_groups() const {
    std::vector<std::pair<std::string, comm::CommPtr>> groups{{"comm_", dp_comm}};
    if (hybrid()) groups.emplace_back("comm_shard_", shard_comm), groups.emplace_back("comm_replica_", replica_comm);
    if (tp > 1) groups.emplace_back("comm_tp_", tp_comm);
    if (pp > 1) groups.emplace_back("comm_pp_", pp_comm);
    if (cp > 1) groups.emplace_back("comm_cp_", cp_comm);
    if (expert_parallel()) groups.emplace_back("comm_ep_", ep_comm), groups.emplace_back("comm_edp_", edp_comm);
    if (eshard_comm)
      groups.emplace_back("comm_edp_shard_", eshard_comm), groups.emplace_back("comm_edp_replica_", ereplica_comm);
    return groups;
  }
};

}  // namespace shardlm::parallel
