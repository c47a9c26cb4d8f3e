// Glob patterns for file names (prepare's inputs, a run's token shards), expanded once, the same
// way everywhere: POSIX glob(3), matches in sorted order.
#pragma once
#include <string>
#include <vector>

namespace shardlm::util {

// Whether `path` holds a glob character (*, ? or [).
bool is_glob(const std::string& path);
// The paths `pattern` matches, sorted; empty when none match. Throws shardlm::Error when the
// expansion itself fails (e.g. a folder that cannot be read).
std::vector<std::string> glob_sorted(const std::string& pattern);

}  // namespace shardlm::util
