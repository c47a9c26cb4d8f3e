// Output-directory writability check (writable_dir.h).
#include "util/writable_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace shardlm::util {

void require_writable_dir(const std::string& dir, const std::string& key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir.empty() ? "." : dir, ec);
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    fail(key, " '", dir, "' cannot be created: '", p.string(), "' is a file, not a directory; choose another ", key);
  if (access(p.c_str(), W_OK | X_OK) != 0)
    fail(key, " '", dir, "' is not writable (", p.string(), ": ", std::strerror(errno), "); choose a writable ", key);
}

}  // namespace shardlm::util
