// Applies pipeline parallelism to a model: this rank keeps only its stage's units (the other
// stages' parameters become empty tensors) and learns who owns what, for the gradient norm, the
// tied embeddings and the final gather. With tied embeddings the last stage keeps its own copy of
// the embedding for the head; the two copies' gradients are summed between the first and last
// stage every step (so both take the same update and stay equal), and the norm counts one copy.
// With interleaved_1f1b a rank holds v model chunks, chunk c being virtual stage c·p + s of the
// p·v runs of layers (the embedding in virtual stage 0 on rank 0, the head in the last on rank p - 1).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/pipeline/stage_split.h"

namespace shardlm::parallel {

class PipelinePlacement {
 public:
  // `model` holds every parameter (full or TP shards); pp: this position's pipeline group;
  // layer_counts: per virtual stage (p·chunks entries).
  PipelinePlacement(model::Llama& model, comm::CommPtr pp, const std::vector<int64_t>& layer_counts, int chunks = 1);

  int stage() const { return pp_->rank(); }
  int stages() const { return pp_->size(); }
  // The unit range of each model chunk this rank runs (one but for interleaved_1f1b).
  const std::vector<pp::StageUnits>& units() const { return units_; }
  const comm::CommPtr& group() const { return pp_; }
  // Per parameter: held by this stage (as a whole tensor, possibly a TP shard).
  const std::vector<bool>& held() const { return held_; }
  // Per parameter: 1, or 0 for the last stage's copy of a tied embedding.
  const std::vector<double>& grad_norm_weights() const { return norm_weights_; }
  // The first and last stage's group for the tied embedding (null without one).
  const comm::CommPtr& tied_group() const { return tied_; }
  // Sums the tied embedding's gradient between the first and last stage (no-op elsewhere).
  void sum_tied_gradients(const at::Tensor& embedding_grad) const;
  // Every parameter's tensor (this rank's TP shard of it) at pipeline rank 0, on the CPU, gathered
  // from the stage that owns it one at a time; `shapes` gives each one's shape (as a TP rank holds it).
  // Other pipeline ranks get undefined tensors. only (when not empty): the parameters to gather;
  // the others pass through untouched (another engine's: parallel/expert/expert_zero.h).
  std::vector<std::pair<std::string, at::Tensor>> gather_to_first(
      const std::vector<std::pair<std::string, at::Tensor>>& local,
      const std::vector<std::vector<int64_t>>& shapes, const std::vector<char>& only = {}) const;

 private:
  comm::CommPtr pp_, tied_;
  std::vector<pp::StageUnits> units_;
  std::vector<bool> held_;
  std::vector<int> owner_;
  std::vector<double> norm_weights_;
};

}  // namespace shardlm::parallel
