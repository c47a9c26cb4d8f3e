// The debug section: off by default, both keys read, a negative interval refused with the fix.
#include <gtest/gtest.h>

#include <fstream>

#include "../data/test_helpers.h"
#include "train/config.h"
#include "util/error.h"

using namespace shardlm;

namespace {
train::TrainConfig load(const std::vector<std::string>& overrides) {
  static const data::testing::TempDir dir;
  const std::string path = dir.file("debug_config.json");
  std::ofstream(path) << R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"}})";
  return train::load_train_config(path, overrides);
}
}  // namespace

TEST(DebugConfig, OffByDefaultAndBothKeysRead) {
  const auto plain = load({});
  EXPECT_EQ(plain.debug.consistency_interval, 0);
  EXPECT_FALSE(plain.debug.check_collectives);
  const auto c = load({"debug.consistency_interval=5", "debug.check_collectives=true"});
  EXPECT_EQ(c.debug.consistency_interval, 5);
  EXPECT_TRUE(c.debug.check_collectives);
}

TEST(DebugConfig, BadValuesAreNamed) {
  try {
    load({"debug.consistency_interval=-2"});
    FAIL() << "a negative interval was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("debug.consistency_interval must be >= 0"), std::string::npos) << e.what();
  }
  try {
    load({"debug.check_colectives=true"});
    FAIL() << "a typo was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown config key 'debug.check_colectives'"), std::string::npos) << e.what();
  }
}
