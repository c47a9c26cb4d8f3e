// The pipeline timeline that `shardlm report` draws: every stage's forward, backward, send and
// receive intervals of one step, gathered onto one rank and written as one JSON line
// (out_dir/pipeline_timeline.jsonl). The events travel as a fixed-size block of doubles per stage
// (at most 6 per micro-batch: forward, backward, two receives, two sends), so one all-gather over the
// pipeline group carries them.
#pragma once
#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include "parallel/pipeline/schedule.h"

namespace shardlm::parallel::pp {

// This stage's events as [6 * micro, 4] doubles (kind, micro-batch, start, end); unused rows kind -1.
at::Tensor pack_events(const StageTimes& times, int64_t micro);

// The gathered blocks of every stage ([stages * 6 * micro, 4]) as
//   {"step": step, "micro_batches": m, "stages": [{"stage": s, "bubble": b, "events": [[name, micro, start, end], ...]}, ...]}
// with times in seconds from the earliest start of any stage. `bubbles` holds each stage's measured
// idle fraction (StageTimes::bubble()).
nlohmann::json timeline_json(const at::Tensor& gathered, int stages, int64_t micro, int64_t step,
                             const std::vector<double>& bubbles);

}  // namespace shardlm::parallel::pp
