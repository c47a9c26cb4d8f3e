// One wording for every failure the commands report: shardlm's own errors as they are, running out
// of memory (std::bad_alloc, c10's OutOfMemoryError) as an error with what to change, filesystem
// failures naming the path, and the library's other errors without their C++ backtrace.
#pragma once
#include <exception>
#include <string>

namespace shardlm::cli {

struct ErrorText {
  std::string message;
  bool internal = false;  // a bug or an unexpected library failure, not bad input or too little memory
};

ErrorText describe_error(const std::exception& e);

}  // namespace shardlm::cli
