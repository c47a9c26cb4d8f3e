// When ZeRO stage 3 gathers and releases each unit, written once: the engine (zero_engine.cpp)
// follows these rules at run time, and the planner replays them (stage3_gathered_peak_numel) to
// predict the largest set of units ever gathered at once, so the two cannot drift apart.
//   forward, unit u:  gather u and the units it also reads (the tied head reads the embedding),
//                     then prefetch the window above u; after u, release u and those units unless
//                     they are kept for backward;
//   backward, unit u: gather u and the units it also reads, prefetch the window below u; release
//                     u, and each unit it also reads, once all of that unit's gradients arrived (at
//                     the backward of the lowest unit of the stage that reads it).
//   prefetch window:  from the next unit in the walk's direction, passing over units that are
//                     persistent or already gathered, up to stage3_prefetch_bucket_size elements;
//                     it stops at the first unit that does not fit what is left.
//   kept for backward: the last unit, and the units the window below it would gather when its
//                     backward starts; they stay gathered from their forward to their backward.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/zero/flat_layout.h"

namespace shardlm::parallel {

// A unit exists only as its shard between uses (else it stays whole: stage3_param_persistence_threshold).
bool stage3_sharded(const FlatUnit& unit, double persistence_threshold);

// The units the prefetch window after `from` gathers, in walk order (direction +1 up, -1 down);
// `passed_over(v)`: v is persistent or already gathered.
std::vector<size_t> stage3_prefetch_window(const FlatLayout& layout, size_t from, int direction, double prefetch_numel,
                                           const std::function<bool(size_t)>& passed_over);

// Per unit, 1 where it stays gathered from its forward to its backward.
std::vector<char> stage3_units_kept_for_backward(const FlatLayout& layout, double prefetch_numel,
                                                 double persistence_threshold);

// The largest number of elements gathered at once while this rank runs units [first, last]:
// `forwards_in_flight` forwards (a pipeline stage's micro-batches alive before its first backward;
// 1 without a pipeline), then a backward, replayed by the rules above.
int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold,
                                   size_t first, size_t last, int forwards_in_flight = 1);
// The whole model, one micro-batch at a time.
int64_t stage3_gathered_peak_numel(const FlatLayout& layout, double prefetch_numel, double persistence_threshold);

}  // namespace shardlm::parallel
