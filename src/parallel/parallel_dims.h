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
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>
#include "comm/communicator.h"

namespace shardlm::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1;
  comm::CommPtr world, dp_comm, tp_comm, pp_comm;

  // dp = 0 means "whatever is left": world / (tp * pp).
  static ParallelDims build(comm::CommPtr world, int dp, int tp, int pp);
  int dp_rank() const { return dp_comm->rank(); }
  bool is_logging_rank() const { return world->rank() == 0; }
  // The layout a checkpoint records (train/checkpoint.h): world, dp, tp, pp, with the run's ZeRO
  // stage and compute dtype. grid_text names a recorded layout's grid and ZeRO stage (what a
  // reshard changes), e.g. "dp=2 tp=1 pp=1 ZeRO 3".
  nlohmann::json layout_json(int zero_stage, const std::string& dtype) const {
    return {{"world", world->size()}, {"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero_stage", zero_stage}, {"dtype", dtype}};
  }
  static std::string grid_text(const nlohmann::json& l) {
    return "dp=" + l.at("dp").dump() + " tp=" + l.at("tp").dump() + " pp=" + l.at("pp").dump() + " ZeRO " +
           l.at("zero_stage").dump();
  }
  // The groups whose traffic a step's metrics record, with their prefix: data parallel as comm_,
  // tensor parallel as comm_tp_, pipeline as comm_pp_ (only the groups the layout has).
  std::vector<std::pair<std::string, comm::CommPtr>> metric_groups() const {
    std::vector<std::pair<std::string, comm::CommPtr>> groups{{"comm_", dp_comm}};
    if (tp > 1) groups.emplace_back("comm_tp_", tp_comm);
    if (pp > 1) groups.emplace_back("comm_pp_", pp_comm);
    return groups;
  }
};

}  // namespace shardlm::parallel
