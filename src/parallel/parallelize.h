// The parallelize step (torchtitan's parallelize_llama): turns a plain Llama into this rank's part
// of a parallel run and returns the Strategy the trainer drives. Applied in a fixed order:
//   1. tensor parallelism (tensor/): shard the parameters, install the regions (f/g, vocab-parallel
//      embedding and loss, sequence parallelism);
//   1a. context parallelism (context/): the attention backend that reaches the other chunks of the
//      sequence (each rank's chunks of every batch come from the trainer: context::split_batch);
//   1b. expert parallelism (expert/): split the experts of every sparse layer over the expert-parallel
//      group and install the all_to_all dispatch (mixture-of-experts models, ep > 1);
//   2. activation checkpointing (model/recompute.h): what each decoder layer keeps for backward;
//   3. pipeline parallelism (pipeline/): keep this stage's consecutive units; the trainer drives
//      micro-batches through the stages with a schedule (pipeline/schedule.h);
//   4. data parallelism over this (tp) position's data-parallel group: bucketed DDP (fp32 stage 0)
//      or the ZeRO engine (stages 1-3, and mixed-precision stage 0), which packs the parameters
//      the model holds after step 1 into its flat units; at stage 3 with LoRA the frozen base is
//      split over the ZeRO group too (zero/sharded_frozen_base.h);
//   5. the step's schedule (pipeline/schedule.h) over this position's pipeline group: 1F1B or
//      GPipe across stages, the one-stage schedule without pipeline parallelism.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/loader/data_loader.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/parallel_dims.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/strategy.h"
#include "parallel/zero/zero_options.h"

namespace shardlm::parallel {

struct ParallelizeOptions {
  bool sequence_parallel = false;
  // Context parallelism (dims.cp > 1; context/context_parallel.h): how the ranks exchange K/V.
  std::string context_mode = "p2p";
  std::vector<int64_t> pipeline_split;  // layer counts per stage; empty: balanced
  pp::Schedule pipeline_schedule = pp::Schedule::OneFOneB;
  int virtual_pipeline = 1;  // model chunks per pipeline rank (interleaved_1f1b)
  int64_t micro_batch = 1, seq_len = 1;  // the shape of what travels between stages
  model::Recompute recompute = model::Recompute::None;
  // Data parallelism: ZeRO stage, device and precision, and the engine's knobs. zero.stage 0 in
  // fp32/fp64 is DDP with buckets of ddp_bucket_bytes.
  ZeroOptions zero;
  int64_t ddp_bucket_bytes = 25ll << 20;
  optim::AdamWOptions adam;
};

// What the trainer drives: the strategy (gradients, optimizer, state) and the step's schedule.
struct Parallelized {
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<pp::Pipeline> schedule;
};

// `model` holds the full, initialised parameters on every rank. What is returned refers to
// `model` and `dims`, which must outlive it.
Parallelized parallelize(model::Llama& model, const ParallelDims& dims, const ParallelizeOptions& options);

// The calls a schedule makes into this rank's stage of `model` under `strategy` (pipeline/schedule.h):
// micro-batch m comes from batch(m) on every stage (tokens, targets, packed samples); the loss to
// back-propagate is the reported loss times loss_multiplier (1 / accumulation x the loss scale).
// Pretraining: the reported loss is the model's mean over the micro-batch. Fine-tuning (targets
// that do not count, Batch::counted_all_ranks >= 0): the reported loss of micro-batch m is its summed
// cross-entropy x (micro-batches x data-parallel ranks) / N, N the counted targets of the whole
// step (every micro-batch of every data-parallel rank, known to each rank from the loader alone),
// so the trainer's mean over micro-batches and ranks, and the gradient DDP/ZeRO average, are the
// sum over the global batch divided by N: the global-batch mean, not a mean of per-micro-batch means.
pp::StageCalls stage_calls(const model::Llama& model, Strategy& strategy,
                           std::function<data::DataLoader::Batch(int64_t)> batch, int64_t seq_len,
                           double loss_multiplier);

}  // namespace shardlm::parallel
