// `shardlm config-keys [--markdown]`: every training config key with its type, default, allowed
// values, DeepSpeed relation and meaning, printed from the one key table (train/config_keys.h).
// docs/configuration.md's key table is this output (tests/integration/test_readme.py compares them).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "train/config_keys.h"
#include "util/error.h"

namespace shardlm::cli {

int run_config_keys(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: shardlm config-keys [--markdown]\n"
                  "  print every training config key (type, default, allowed values, DeepSpeed, meaning)\n"
                  "  as docs/configuration.md's Markdown table\n");
      return 0;
    }
    if (a != "--markdown") fail("unexpected argument '", a, "'; usage: shardlm config-keys [--markdown]");
  }
  std::printf("%s", train::config_keys_markdown().c_str());
  return 0;
}

}  // namespace shardlm::cli
