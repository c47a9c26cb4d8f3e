// The expert-parallel dispatch (model/moe.h ExpertDispatch) that parallel/expert/expert_parallel.h
// installs: a sparse layer's routed rows, sorted by expert, go to the rank of the EP group holding
// their expert and come back as the experts' outputs, in order. Per layer and forward:
//   1. one all_to_all of the per-expert counts (each owner learns how many rows of each of its
//      experts every peer sends);
//   2. all_to_all of the rows (autograd-aware, all_to_all_ops.h): rank j's rows for this rank's
//      experts arrive grouped by source rank, then expert;
//   3. a permutation to expert-major order (every source's rows of local expert 0, then 1, ...) and
//      the two grouped products over this rank's experts (model::expert_products);
//   4. the inverse permutation and the all_to_all back (counts transposed).
// Backward runs the same exchanges in reverse (the all_to_all op's gradient), so each expert's
// weight gradient sums every row routed to it from the whole EP group.
#pragma once
#include <memory>

#include "comm/communicator.h"
#include "model/moe.h"

namespace shardlm::parallel::expert {

// experts_per_rank: E / ep, the experts each rank of `ep` keeps (rank r: [r E/ep, (r+1) E/ep)).
std::shared_ptr<model::ExpertDispatch> make_expert_dispatch(comm::CommPtr ep, int64_t experts_per_rank);

}  // namespace shardlm::parallel::expert
