// Expert parallelism (Megatron-Core MoE, DeepSpeed-MoE): the routed experts of every sparse layer
// are split over the expert-parallel group (parallel_dims.h ep_comm), E/ep consecutive experts per
// rank (ep rank r keeps experts [r E/ep, (r+1) E/ep)); routed rows travel to their experts' rank
// and back by all_to_all (expert_dispatch.h). Everything else (attention, norms, the router, the
// shared expert, dense layers) stays replicated over the group.
//
// This object applies it to a plain model, beside tensor and pipeline parallelism in ModelSplit:
// it replaces each expert tensor (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]) by this
// rank's contiguous slice of experts (rows of dim 0: a contiguous element range, which checkpoints
// name "<name>@<first element>"), installs the dispatch, and answers what the data-parallel
// strategies ask:
//   - which parameters are experts: their gradients are averaged over the expert-data-parallel
//     group edp_comm (the dp/ep ranks holding the same experts). The all_to_all's backward already
//     sums every rank's contribution of its EP group into the owner's gradient, so the owner divides
//     the edp sum by dp (not by edp): the mean over the whole data-parallel batch, as one process.
//   - the gradient norm: experts' squares summed over the EP group, the replicated rest counted once;
//   - the whole model back (the expert slices all-gathered over the EP group).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"

namespace shardlm::parallel {

class ExpertParallel {
 public:
  // `model` holds every expert, identical on every rank of `ep`. Refuses a dense model and an expert
  // count ep does not divide, naming parallelism.expert_parallel.
  ExpertParallel(model::Llama& model, comm::CommPtr ep, comm::CommPtr edp, int dp);
  static void check(const model::LlamaConfig& cfg, int ep);

  int size() const { return ep_->size(); }
  int rank() const { return ep_->rank(); }
  const comm::CommPtr& group() const { return ep_; }
  const comm::CommPtr& expert_data_parallel() const { return edp_; }
  // The data-parallel size the expert gradients' edp sum is divided by (all of dp).
  int data_parallel_size() const { return dp_; }
  // Per model parameter: whether it is an expert slice.
  bool is_expert(size_t param) const { return is_expert_[param]; }
  const std::vector<char>& expert_mask() const { return is_expert_; }
  // Where this rank's slice of expert parameter `param` starts in the whole tensor (elements), 0 for
  // the others.
  int64_t first_element(size_t param) const;
  // The weight of parameter i's squared gradient in the model's norm before the sum over the EP
  // group: 1 for experts (each slice once), 1/ep for the replicated rest.
  double grad_norm_weight(size_t param) const { return is_expert_[param] ? 1.0 : 1.0 / size(); }
  // Whole tensors from this rank's (name, tensor) list in model order: expert slices all-gathered
  // over the EP group (every rank of it gets them), the rest passed through.
  std::vector<std::pair<std::string, at::Tensor>> unshard(std::vector<std::pair<std::string, at::Tensor>> local) const;
  std::string describe_prefix() const { return "ep=" + std::to_string(size()) + " x "; }

 private:
  comm::CommPtr ep_, edp_;
  int dp_;
  std::vector<char> is_expert_;
  std::vector<int64_t> first_element_;
};

}  // namespace shardlm::parallel
