// Failure wording for the commands (error_text.h).
#include "cli/error_text.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <new>

#include "util/error.h"

namespace shardlm::cli {
namespace {

const char* kMemoryAdvice =
    "; lower train_micro_batch_size_per_gpu or data.seq_len, raise zero_optimization.stage, set "
    "activation_checkpointing.mode=full, or use more ranks (`shardlm plan` predicts the memory per rank)";

// c10's first line: its message without "Exception raised from ..." and the frames.
std::string first_line(const char* text) {
  std::string s(text);
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

ErrorText describe_error(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return {e.what(), false};
  if (dynamic_cast<const std::bad_alloc*>(&e)) return {std::string("out of memory: a host allocation failed") + kMemoryAdvice, false};
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e))
    return {"out of memory on the device: " + first_line(oom->what_without_backtrace()) + kMemoryAdvice, false};
  if (const auto* fe = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    std::string msg = "cannot access '" + fe->path1().string() + "': " + fe->code().message();
    if (!fe->path2().empty()) msg += " (with '" + fe->path2().string() + "')";
    return {msg + "; check that the path exists and is writable (e.g. out_dir)", false};
  }
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    const std::string line = first_line(ce->what_without_backtrace());
    // The CPU allocator reports failure as a plain c10::Error ("DefaultCPUAllocator: can't allocate memory").
    for (const char* oom : {"can't allocate memory", "not enough memory", "out of memory"})
      if (line.find(oom) != std::string::npos) return {"out of memory: " + line + kMemoryAdvice, false};
    return {line, true};
  }
  return {e.what(), true};
}

}  // namespace shardlm::cli
