// `shardlm config-keys [--markdown]`: every training config key with its type, default, allowed
// values, DeepSpeed relation and meaning, printed from the one key table (train/config_keys.h).
// docs/configuration.md's key table is this output (tests/integration/test_readme.py compares them).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "train/config_keys.h"

namespace shardlm::cli {

int run_config_keys(int argc, char** argv) {
  CLI::App app{"Print every training config key (type, default, allowed values, DeepSpeed, meaning)",
               "shardlm config-keys"};
  bool markdown = false;
  app.add_flag("--markdown", markdown, "as docs/configuration.md's Markdown table (the default output too)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::printf("%s", train::config_keys_markdown().c_str());
  return 0;
}

}  // namespace shardlm::cli
