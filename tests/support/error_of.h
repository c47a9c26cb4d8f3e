// The one "what did this call refuse with?" helper of the tests: runs a call and returns the message
// of the exception it throws (shardlm::Error and the library's others), or "(no error)" when it
// returns normally, so a test asserts on the wording a user would read and a failed assertion prints
// what the call said. Shared by every test binary (unit layers, MPI suites), included by relative path.
#pragma once
#include <exception>
#include <string>
#include <utility>

namespace shardlm::test_support {

template <typename F>
std::string error_of(F&& call) {
  try {
    std::forward<F>(call)();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace shardlm::test_support
