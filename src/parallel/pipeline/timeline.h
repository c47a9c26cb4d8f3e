// The pipeline timeline that `shardlm report` draws: every stage's forward, backward, send and
// receive intervals of one step, gathered onto one rank and written as one JSON line
// (out_dir/pipeline_timeline.jsonl). The events travel as a fixed-size block of doubles per stage
// (at most 7 per micro-batch and model chunk: forward, backward, zb_h1's weight backward, two
// receives, two sends), so one all-gather over the pipeline group carries them.
#pragma once
#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include "parallel/pipeline/schedule.h"

namespace shardlm::parallel::pp {

// Rows of one stage's block: StageEvent::kKinds per micro-batch and model chunk.
inline int64_t event_rows(int64_t micro, int chunks) { return StageEvent::kKinds * micro * chunks; }
inline constexpr int64_t kEventColumns = 5;  // kind, micro-batch, start, end, chunk

// This stage's events as [rows, 5] doubles (kind, micro-batch, start, end, chunk); unused rows kind -1.
at::Tensor pack_events(const StageTimes& times, int64_t rows);

// The gathered blocks of every stage ([stages * rows, 5]) as
//   {"step": step, "micro_batches": m, "schedule": name, "chunks": v, "bubble_formula": f,
//    "stages": [{"stage": s, "bubble": b, "events": [[name, micro, start, end, chunk], ...]}, ...]}
// with times in seconds from the earliest start of any stage. `bubbles` holds each stage's measured
// idle fraction (StageTimes::bubble()).
nlohmann::json timeline_json(const at::Tensor& gathered, int stages, int64_t micro, int64_t step,
                             const std::vector<double>& bubbles, int64_t rows, const std::string& schedule = "1f1b",
                             int chunks = 1);

}  // namespace shardlm::parallel::pp
