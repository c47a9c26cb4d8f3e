// Resident memory of this process from /proc (Linux): the current RSS and its high-water mark,
// which can be reset. Used to measure the activation peak of a training step on CPU, where
// libtorch keeps no allocator statistics.
#pragma once
#include <cstdint>

namespace shardlm {

int64_t resident_bytes();       // VmRSS
int64_t peak_resident_bytes();  // VmHWM
void reset_peak_resident();     // writes 5 to /proc/self/clear_refs: VmHWM := VmRSS
int64_t heap_in_use_bytes();    // glibc allocator statistics: bytes currently allocated (mallinfo2)
// Returns the free pages of the heap to the system (glibc's malloc_trim): what start-up freed (a
// QLoRA base's plain weights, a pipeline stage's other layers) stops being resident, so a
// measurement of the resident set's growth that follows does not depend on which holes it reuses.
void release_free_heap();

}  // namespace shardlm
