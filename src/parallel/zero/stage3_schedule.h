// When ZeRO stage 3 gathers and releases each unit, written once: the engine (zero_engine.cpp)
// follows these rules at run time, and the planner replays them (stage3_gathered_peak_numel) to
// predict the largest set of units ever gathered at once, so the two cannot drift apart.
//   forward, unit u:  gather u and the units it also reads (the tied head reads the embedding),
//                     then the prefetch window above u; after u, release u and those units unless
//                     they are kept for backward;
//   backward, unit u: gather u and the units it also reads, then the window below u; release u,
//                     and each unit it also reads, once all of that unit's gradients arrived (at
//                     the backward of the lowest unit of the stage that reads it).
//   prefetch window:  the sharded units next to u in the walk's direction, taken while those taken
//                     so far (already gathered or not) add up to less than
//                     stage3_prefetch_bucket_size elements: as DeepSpeed's loop, the last one may
//                     overshoot, so a budget smaller than a unit still prefetches the next unit, and
//                     0 prefetches nothing. Unlike DeepSpeed, which counts only what a call newly
//                     fetches and bounds the total with stage3_max_live_parameters, the window counts
//                     what is already gathered ahead, so it bounds memory by itself. It stops at an
//                     empty unit (another pipeline stage's: a last stage's copy of the tied embedding
//                     is gathered by the head that reads it, not by the walk). So at most the current
//                     unit, the units it reads, the window and the units kept for backward are
//                     gathered at once.
//   kept for backward: the last unit, and the window below it when its backward starts; they stay
//                     gathered from their forward to their backward.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/zero/flat_layout.h"

namespace shardlm::parallel {

// A unit exists only as its shard between uses (else it stays whole: stage3_param_persistence_threshold).
bool stage3_sharded(const FlatUnit& unit, double persistence_threshold);

// The units of the prefetch window after `from`, in walk order (direction +1 up, -1 down), gathered
// or not: the caller gathers those that are not.
std::vector<size_t> stage3_prefetch_window(const FlatLayout& layout, size_t from, int direction, double prefetch_numel,
                                           double persistence_threshold);

// Per unit, 1 where it stays gathered from its forward to its backward.
std::vector<char> stage3_units_kept_for_backward(const FlatLayout& layout, double prefetch_numel,
                                                 double persistence_threshold);

// Per unit, the unit of [first, last] whose backward completes its gradients: the lowest unit of the
// range that uses it (itself, or a lower one that also reads it: the tied head's embedding); units.size()
// where none does. Release after backward follows it, in the engine and in the replay below.
std::vector<size_t> stage3_gradients_complete_at(const FlatLayout& layout, size_t first, size_t last);

// The largest number of elements gathered at once while this rank runs units [first, last]:
// `forwards_in_flight` forwards (a pipeline stage's micro-batches alive before its first backward;
// 1 without a pipeline), then a backward, replayed by the rules above.
int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold,
                                   size_t first, size_t last, int forwards_in_flight = 1);
// The whole model, one micro-batch at a time.
int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold);

}  // namespace shardlm::parallel
