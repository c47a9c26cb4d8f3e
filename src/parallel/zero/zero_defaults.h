// DeepSpeed's defaults of the zero_optimization sizes (elements), written once: the trainer's
// config and the planner's request start from the same values, so a plan made without a config
// predicts the run a config without these keys makes.
#pragma once

namespace shardlm::parallel::zero_defaults {

constexpr double kReduceBucketSize = 5e8;                // reduce_bucket_size; 0: unit by unit, no buckets
constexpr double kAllgatherBucketSize = 5e8;             // allgather_bucket_size
constexpr double kStage3PrefetchBucketSize = 5e7;        // stage3_prefetch_bucket_size
constexpr double kStage3ParamPersistenceThreshold = 1e5; // stage3_param_persistence_threshold

}  // namespace shardlm::parallel::zero_defaults
