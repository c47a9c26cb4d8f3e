// A run's output directory must be writable before any rank starts: a read-only out_dir used to
// surface only after the model was built, as a bare filesystem error from one rank.
#pragma once
#include <string>

namespace shardlm::util {

// Fails (naming `key`, the directory, the reason and the fix) unless `dir` exists as a writable
// directory or could be created: its deepest existing ancestor is a writable directory. Creates nothing.
void require_writable_dir(const std::string& dir, const std::string& key);

}  // namespace shardlm::util
