#include "util/process_memory.h"

#include <malloc.h>

#include <fstream>
#include <string>

namespace shardlm {
namespace {
int64_t status_field(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // "VmRSS:  1234 kB"
  return 0;
}
}  // namespace

int64_t resident_bytes() { return status_field("VmRSS:"); }
int64_t peak_resident_bytes() { return status_field("VmHWM:"); }
void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }
void release_free_heap() { ::malloc_trim(0); }

int64_t heap_in_use_bytes() {
  const auto info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);  // heap chunks in use + mmap'd chunks
}

}  // namespace shardlm
