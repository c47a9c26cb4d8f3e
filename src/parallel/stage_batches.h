// The micro-batches a step's schedule reads from a data loader, in the form stage_calls
// (parallelize.h) takes. A stage asks for micro-batch m's tokens and then its targets (with packed
// samples also their positions and segments), so the last batch read is kept and each is assembled
// once. It lives beside stage_calls rather than in the trainer because it is the schedule's way
// of reading data, the same for training and evaluation batches.
#pragma once
#include <cstdint>
#include <functional>

#include "data/loader/prefetch.h"

namespace shardlm::parallel {

// Micro-batch m is the loader's micro-step first + m, on the prefetcher's device; the seconds spent
// waiting for batches (assembling them, when the prefetch has not) are added to *seconds (the step's
// time_data_s). `batches` and `seconds` must outlive it.
std::function<data::DataLoader::Batch(int64_t)> stage_batches(data::BatchPrefetcher& batches, int64_t first,
                                                              double* seconds);

}  // namespace shardlm::parallel
