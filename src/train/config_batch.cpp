// DeepSpeed's batch-size rule, in one place: train_batch_size = micro-batch x accumulation steps x
// data-parallel ranks, and whichever of the three a config leaves out follows from the others (a
// config written for DeepSpeed often gives train_batch_size and gradient_accumulation_steps only).
// It needs the job's size, so it runs where validate_for runs first: before ranks start and in each.
#include "train/config.h"
#include "util/error.h"

#include <algorithm>

namespace shardlm::train {

void TrainConfig::resolve_for(int world_size) {
  const int model_split = parallelism.tensor_parallel * parallelism.pipeline_parallel;
  if (model_split < 1 || world_size % model_split != 0) return validate_for(world_size);  // names the split problem
  const int64_t dp = world_size / model_split / std::max(1, parallelism.context_parallel);
  const auto derive = [&](const char* what, int64_t known) {
    if (train_batch_size % known != 0)
      fail("cannot derive ", what, ": train_batch_size = ", train_batch_size, " is not divisible by ",
           micro_batch ? "train_micro_batch_size_per_gpu x data-parallel ranks = " : "gradient_accumulation_steps x data-parallel ranks = ",
           micro_batch ? micro_batch : grad_accum, " x ", dp, " = ", known,
           ". Choose train_batch_size as a multiple of ", known, " or give all three batch keys.");
    return train_batch_size / known;
  };
  if (train_batch_size > 0) {
    if (micro_batch == 0 && grad_accum == 0) grad_accum = 1;  // DeepSpeed: only train_batch_size given
    if (micro_batch == 0) micro_batch = derive("train_micro_batch_size_per_gpu", grad_accum * dp);
    else if (grad_accum == 0) grad_accum = derive("gradient_accumulation_steps", micro_batch * dp);
  }
  validate_for(world_size);  // all three given: they must agree
  // "train_batch_size": "auto" (Hugging Face's world x micro-batch x accumulation): the product,
  // written to train_config.json like a given one.
  if (train_batch_size_auto && train_batch_size == 0) {
    train_batch_size = micro_batch * grad_accum * dp;
    for (auto& n : notices)
      if (n.rfind("train_batch_size \"auto\"", 0) == 0) n += " = " + std::to_string(train_batch_size);
  }
}

}  // namespace shardlm::train
