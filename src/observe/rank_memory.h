// Memory of every rank, every step: one rank running out of memory kills the job, and the logging
// rank's own numbers do not show which rank is closest. The trainer gathers each rank's peak of the
// step (CPU: the resident set's high-water mark, reset at each step's start; GPU: the caching
// allocator's peak allocated bytes since the start, which memory.json also reports) to the logging rank, which records them per rank and the spread across ranks in metrics.jsonl.
#pragma once
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "comm/communicator.h"
#include "observe/metrics.h"

namespace shardlm::observe {

// metrics.jsonl keys, for a per-rank value `<kind>.rank<r>` and across ranks `<kind>_max`, `_min`,
// `_mean` and `_imbalance` (max / min: 1 = balanced).
inline const char* const kPeakRss = "memory_peak_rss";
inline const char* const kDevicePeakAllocated = "memory_device_peak_allocated";

// Records `per_rank` (bytes, rank order) under `kind` in m.extra.
void record_rank_memory(const std::string& kind, const std::vector<double>& per_rank, StepMetrics& m);

// Gathers every rank's step peak (resident set; on a GPU also the allocator's peak) over `world`
// (a collective) and records them on every rank.
void gather_rank_memory(comm::Communicator& world, c10::Device device, StepMetrics& m);

// A communicator's bytes, wait and in-flight seconds per operation since its last reset_stats(), as
// <prefix><op>_bytes / _wait_s / _inflight_s (several communicators under one prefix add up).
void record_comm_stats(const comm::Communicator& c, const std::string& prefix, StepMetrics& m);

}  // namespace shardlm::observe
