// How the model itself is split on this rank, below data parallelism: tensor parallelism (shards of
// every layer) and pipeline parallelism (this stage's layers), either or both absent. The data-
// parallel strategies (DDP, ZeRO) hold one and ask it what only the split knows: how much each
// parameter's gradient counts in the model's norm, which groups the norm sums over, how gradients
// shared between pipeline stages are summed, and how the whole HF model is gathered back.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/expert/expert_parallel.h"
#include "parallel/pipeline/placement.h"
#include "parallel/tensor/tensor_parallel.h"

namespace shardlm::parallel {

struct ModelSplit {
  std::shared_ptr<TensorParallel> tp;        // null: no tensor parallelism
  std::shared_ptr<PipelinePlacement> pp;     // null: one stage
  std::shared_ptr<ExpertParallel> ep;        // null: every rank holds every expert

  // Whether this rank holds parameter i (pipeline: its stage's units).
  bool holds(size_t i) const { return !pp || pp->held()[i]; }
  // The weight of parameter i's squared gradient norm (replicated TP tensors and the last stage's
  // tied embedding count once over their copies).
  double grad_norm_weight(size_t i) const;
  // The model's squared gradient norm from this rank's weighted sum: summed over TP and pipeline.
  double sum_over_model(double weighted_local) const;
  // After the data-parallel reduction: sums the tied embedding's gradient between the first and
  // last pipeline stage. `embedding_grad` returns this rank's gradient of the embedding (DDP: the
  // whole tensor; ZeRO: the embedding unit's shard, laid out alike on both stages).
  void finish(const std::function<at::Tensor()>& embedding_grad) const;
  // Whole HF tensors on world rank 0 from this rank's pieces (local: every parameter by name, as
  // held; a collective over the TP and pipeline groups). only (when not empty): the parameters to
  // gather, the same on every rank (an engine's: expert parallelism's two ZeRO engines each gather
  // their own); the others pass through untouched.
  std::vector<std::pair<std::string, at::Tensor>> gather(const model::Llama& model,
                                                         std::vector<std::pair<std::string, at::Tensor>> local,
                                                         const std::vector<char>& only = {}) const;
  // "tp=2 x pp=2 (1f1b) x ..." for the start-up line.
  std::string describe_prefix() const;
  // Communicators whose traffic the split adds beyond ParallelDims' (TP's KV-head groups, the tied
  // embedding's first-and-last-stage group).
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const;
  // Whether every rank holds the whole model (what train/checkpoint.h can save).
  bool whole() const { return !tp && !pp && !ep; }
  // Whether parameter i is an expert slice (expert parallelism; its gradient is averaged over edp).
  bool is_expert(size_t i) const { return ep && ep->is_expert(i); }
};

}  // namespace shardlm::parallel
