// See glob.h.
#include "util/glob.h"

#include <glob.h>

#include "util/error.h"

namespace shardlm::util {

bool is_glob(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> matches;
  if (rc == 0) matches.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);  // glob(3) sorts them
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) fail("cannot expand the file pattern ", pattern, " (glob error ", rc, "); check the folder's permissions");
  return matches;
}

}  // namespace shardlm::util
