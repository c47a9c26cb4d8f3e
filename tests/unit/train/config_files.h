// What the training-config unit tests share: a config written to a temporary file, and the error
// message loading it gives. (test_config, test_config_losses and test_deepspeed_keys each had a copy.)
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "../data/test_helpers.h"
#include "train/config.h"
#include "util/error.h"

namespace shardlm::train::testing {

// The test program's scratch folder, removed when it ends.
inline const data::testing::TempDir& scratch_dir() {
  static const data::testing::TempDir d;
  return d;
}

// `text` written to a fresh file of the scratch folder; its path.
inline std::string write_config(const std::string& text) {
  static int n = 0;
  const std::string path = scratch_dir().file("config_" + std::to_string(n++) + ".json");
  std::ofstream(path) << text;
  return path;
}

// The error loading `text` with `overrides` stops with, or "" when it loads.
inline std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    load_train_config(write_config(text), overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The smallest config that loads: the tiny preset on a placeholder token file (tests add overrides).
inline const char* kBase = R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"}})";
// Whether an error message holds `needle`.
inline bool has(const std::string& msg, const std::string& needle) { return msg.find(needle) != std::string::npos; }

}  // namespace shardlm::train::testing
