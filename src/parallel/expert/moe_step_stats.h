// The MoE statistics of one optimizer step, gathered where the parallel layout is known: the trainer
// only writes the metrics this returns. A sparse model's router counts and load-balancing losses are
// held by the model (model/moe.h), partial per rank; which groups must sum them depends on the layout
// (data-parallel ranks see other rows, pipeline stages other layers, sequence-parallel tp ranks other
// positions), which is parallel/'s knowledge, not the step loop's.
#pragma once
#include <map>
#include <string>

#include "model/llama.h"
#include "parallel/parallel_dims.h"

namespace shardlm::parallel {

// For a MoE model (empty map otherwise), in one all-reduce over the data-parallel and pipeline groups:
// - router_aux_loss (with output_router_logits): the load-balancing loss (model/moe.h, one per
//   micro-batch as transformers computes it) averaged over the step's micro-batches on every
//   data-parallel rank, before router_aux_loss_coef (the loss includes coef x each); tensor-parallel
//   ranks compute the same values. Pipeline stages: the last stage's (the others' count none);
// - moe_tokens_expert_<e>: the step's routed assignments per expert (all sparse layers and
//   micro-batches, summed over the data-parallel ranks: the global batch's), and moe_dropped_tokens,
//   those a capacity factor dropped. Each pipeline stage counts its own layers; tensor-parallel ranks
//   route the same positions, or under sequence parallelism each its own part of them (summed over
//   tp too).
// Takes (and so resets) the model's counters; every rank must call it once per step.
std::map<std::string, double> moe_step_metrics(model::Llama& model, const ParallelDims& dims, bool sequence_parallel);

}  // namespace shardlm::parallel
