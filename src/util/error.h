// One exception type for every user-facing failure (bad config, bad file, bad arguments). The CLI
// catches it at the top, prints its message and exits non-zero; messages name the problem and the fix.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// fail("tensor ", name, " has shape ", s) builds the message from its pieces and throws Error.
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
}

}  // namespace shardlm
