// Every key the pinned DeepSpeed reads has a row (issue 24 item 6): tests/data/deepspeed/KEYS.md,
// written by scripts/deepspeed_keys.py from DeepSpeed's source, agrees with the key table; every
// DeepSpeed section or key switched off loads with a notice; a missing feature switched on is
// refused naming the key and the fix.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "../data/test_helpers.h"
#include "train/config.h"
#include "train/config_keys.h"
#include "util/error.h"

using namespace shardlm;

namespace {
const char* kBase = R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"}})";

std::string write_config(const std::string& text) {
  static const data::testing::TempDir dir;
  static int n = 0;
  const std::string path = dir.file("ds_keys_" + std::to_string(n++) + ".json");
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    train::load_train_config(write_config(kBase), overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool noticed(const train::TrainConfig& c, const std::string& part) {
  for (const auto& n : c.notices)
    if (has(n, part)) return true;
  return false;
}

std::string kind_of(train::DeepSpeed d) {
  switch (d) {
    case train::DeepSpeed::Same: return "honoured";
    case train::DeepSpeed::Alias: return "alias";
    case train::DeepSpeed::NoEffect: return "notice";
    case train::DeepSpeed::Refused: return "refused";
    case train::DeepSpeed::None: return "shardlm";
  }
  return "";
}

const std::map<std::string, const train::ConfigKey*>& rows() {
  static const auto m = [] {
    std::map<std::string, const train::ConfigKey*> out;
    for (const auto& k : train::config_keys()) out[k.path] = &k;
    return out;
  }();
  return m;
}

// The row the parser reads a key by: its own, or the nearest section row that takes it whole.
std::string answering_row(const std::string& key) {
  for (std::string path = key;;) {
    if (rows().count(path)) return path;
    const auto dot = path.rfind('.');
    if (dot == std::string::npos) return "";
    path = path.substr(0, dot);
  }
}
}  // namespace

TEST(DeepSpeedKeys, EveryKeyTheExtractorFoundHasTheRowAndKindKeysMdSays) {
  std::ifstream in(std::string(SHARDLM_SOURCE_DIR) + "/tests/data/deepspeed/KEYS.md");
  ASSERT_TRUE(in) << "tests/data/deepspeed/KEYS.md is missing; run scripts/deepspeed_keys.py";
  const std::regex line(R"(^\| `([^`]+)` \| (\S+) \| `([^`]+)` \| (\w+) \| (reads|refuses) \|$)");
  int keys = 0;
  std::map<std::string, int> kinds;
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    if (!std::regex_match(text, m, line)) continue;
    ++keys;
    const std::string key = m[1], row = m[3], kind = m[4];
    EXPECT_EQ(answering_row(key), row) << key << " (DeepSpeed's " << m[2] << "): KEYS.md names row " << row;
    const auto it = rows().find(row);
    if (it == rows().end()) continue;
    EXPECT_EQ(kind_of(it->second->deepspeed), kind) << key << ": KEYS.md says " << kind << " for row " << row;
    EXPECT_NE(kind, "shardlm") << key << " is DeepSpeed's, answered by shardlm's own row " << row;
    ++kinds[kind];
  }
  // A truncated or unparsed file must not pass: the pinned DeepSpeed reads over 350 keys.
  EXPECT_GE(keys, 350);
  for (const char* k : {"honoured", "alias", "notice", "refused"}) EXPECT_GT(kinds[k], 0) << k;
}

// Every refused DeepSpeed key or section given the value that turns its feature off, and every
// DeepSpeed key or section without effect, loads with a notice naming it.
TEST(DeepSpeedKeys, EverySectionSwitchedOffLoadsWithANotice) {
  int off = 0, neutral = 0;
  for (const auto& k : train::config_keys()) {
    std::string value;
    if (k.deepspeed == train::DeepSpeed::Refused) {
      if (!nlohmann::json::accept(k.harmless_doc)) continue;  // "absent", "<= 1 (1: no hpZ)"
      value = k.harmless_doc, ++off;
    } else if (k.deepspeed == train::DeepSpeed::NoEffect) {
      value = k.type == "object" ? "{}" : k.type == "bool" ? "false" : k.type == "string" ? "\"fp32\""
              : k.type.rfind("list", 0) == 0                ? "[]"
                                                             : "0";
      ++neutral;
    } else {
      continue;
    }
    try {
      const auto c = train::load_train_config(write_config(kBase), {k.path + "=" + value});
      EXPECT_TRUE(noticed(c, k.path + ": accepted")) << k.path << " = " << value;
    } catch (const Error& e) {
      ADD_FAILURE() << k.path << " = " << value << ": " << e.what();
    }
  }
  EXPECT_GE(off, 25);
  EXPECT_GE(neutral, 100);
  // The oldest section name is read as the section (config_deepspeed.cpp), its row listed.
  EXPECT_TRUE(train::load_train_config(write_config(kBase), {"bfloat16={\"enabled\": true}"}).bf16);
  // A typo inside a section read key by key stays an error.
  EXPECT_TRUE(has(error_of({"comet.enabeld=true"}), "unknown config key 'comet.enabeld'"));
}

// A feature DeepSpeed has and shardlm lacks, switched on as a config would, is refused naming the
// key, the values that turn it off and why.
TEST(DeepSpeedKeys, EachMissingFeatureSwitchedOnIsRefusedNamingKeyAndFix) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"torch_autocast={\"enabled\": true, \"dtype\": \"bfloat16\"}", "torch_autocast",
       "set torch_autocast.enabled false"},
      {"weight_quantization={\"num_bits\": 8}", "weight_quantization", "\"enabled\": false"},
      {"expert_parallel={\"enabled\": true, \"autoep_size\": 2}", "expert_parallel", "parallelism.expert_parallel"},
      {"elasticity={\"enabled\": true, \"max_train_batch_size\": 64}", "elasticity", "\"enabled\": false"},
      {"sequence_parallel_size=2", "sequence_parallel_size", "set it to 1"},
      {"gradient_allreduce_op=sum", "gradient_allreduce_op", "Set it to \"mean\""},
      {"managed_gradient_accumulation=false", "managed_gradient_accumulation", "Set it to true"},
      {"communication_data_type=fp16", "communication_data_type", "remove it"},
      {"bf16.bf16_master_weights_and_grads=true", "bf16.bf16_master_weights_and_grads",
       "optimizer.master_precision \"bf16\""},
      {"bf16.bf16_optimizer_states=true", "bf16.bf16_optimizer_states", "optimizer.state_precision"},
      {"fp16.fp16_master_weights_and_grads=true", "fp16.fp16_master_weights_and_grads", "set it to false"},
      {"data_types.param_dtype=bf16", "data_types.param_dtype", "set it to \"fp32\""},
      {"data_types.keep_in_fp32_modules=[\"norm\"]", "data_types.keep_in_fp32_modules", "set it to \"auto\""},
      {"tensor_parallel.tp={\"tp_size\": 2}", "tensor_parallel.tp", "parallelism.tensor_parallel"},
      {"tensor_parallel.replace_with_kernel_inject=true", "tensor_parallel.replace_with_kernel_inject",
       "set it to false"},
      {"zero_optimization.load_from_fp32_weights=false", "zero_optimization.load_from_fp32_weights",
       "Set it to true"},
      {"scheduler.params.cycle_max_lr=0.1", "scheduler.params.cycle_max_lr", "OneCycle"},
      {"scheduler.params.lr_range_test_min_lr=0.1", "scheduler.params.lr_range_test_min_lr", "LRRangeTest"},
      {"sparse_gradients=true", "sparse_gradients", "set it to false"},
      {"compression_training={\"weight_quantization\": {}}", "compression_training", "remove the section"},
  };
  for (const auto& [override_, key, fix] : cases) {
    const std::string err = error_of({override_});
    EXPECT_TRUE(has(err, key)) << override_ << ": " << err;
    EXPECT_TRUE(has(err, fix)) << override_ << ": " << err;
    EXPECT_FALSE(has(err, "unknown")) << override_ << ": " << err;
  }
  // The same keys with the values that turn them off load.
  for (const char* ok : {"sequence_parallel_size=1", "gradient_allreduce_op=mean", "managed_gradient_accumulation=true",
                         "data_types.param_dtype=float32", "tensor_parallel.tp={\"tp_size\": 1}",
                         "zero_optimization.load_from_fp32_weights=true", "weight_quantization={\"enabled\": false}"})
    EXPECT_EQ(error_of({ok}), "") << ok;
}
