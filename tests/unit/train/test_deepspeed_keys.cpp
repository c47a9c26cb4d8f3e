// Every key the pinned DeepSpeed reads has a row (issue 24 item 6): tests/data/deepspeed/KEYS.md,
// written by scripts/deepspeed_keys.py from DeepSpeed's source, agrees with the key table; every
// DeepSpeed section or key switched off loads with a notice; a missing feature switched on is
// refused naming the key and the fix.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <tuple>

#include "config_files.h"
#include "train/config.h"
#include "train/config_keys.h"
#include "util/error.h"

using namespace shardlm;

namespace {
using train::testing::kBase;

using train::testing::write_config;

std::string refusal_of(const std::vector<std::string>& overrides) { return train::testing::error_of(kBase, overrides); }

using train::testing::has;

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
  EXPECT_TRUE(has(refusal_of({"comet.enabeld=true"}), "unknown config key 'comet.enabeld'"));
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
      {"gradient_allreduce_op=sum", "gradient_allreduce_op", "Set it to \"mean\""},
      {"managed_gradient_accumulation=false", "managed_gradient_accumulation", "Set it to true"},
      {"communication_data_type=fp16", "communication_data_type", "remove it"},
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
    const std::string err = refusal_of({override_});
    EXPECT_TRUE(has(err, key)) << override_ << ": " << err;
    EXPECT_TRUE(has(err, fix)) << override_ << ": " << err;
    EXPECT_FALSE(has(err, "unknown")) << override_ << ": " << err;
  }
  // The same keys with the values that turn them off load.
  for (const char* ok : {"sequence_parallel_size=1", "gradient_allreduce_op=mean", "managed_gradient_accumulation=true",
                         "data_types.param_dtype=float32", "tensor_parallel.tp={\"tp_size\": 1}",
                         "zero_optimization.load_from_fp32_weights=true", "weight_quantization={\"enabled\": false}"})
    EXPECT_EQ(refusal_of({ok}), "") << ok;
}

// DeepSpeed-Ulysses' sequence_parallel_size is context parallelism over that many ranks with the
// all_to_all exchange (parallel/context/context_parallel.h); 1 leaves the run as it is.
TEST(DeepSpeedKeys, SequenceParallelSizeIsUlyssesContextParallelism) {
  const auto c = train::load_train_config(write_config(kBase), {"sequence_parallel_size=2"});
  EXPECT_EQ(c.parallelism.context_parallel, 2);
  EXPECT_EQ(c.parallelism.context_parallel_mode, "all_to_all");
  const auto one = train::load_train_config(write_config(kBase), {"sequence_parallel_size=1"});
  EXPECT_EQ(one.parallelism.context_parallel, 1);
  EXPECT_EQ(one.parallelism.context_parallel_mode, "p2p");
}

namespace {
// What a config resolves to: the error, or the four settings DeepSpeed's bf16 keys map onto
// (optimizer.master_precision, master_rounding, state_precision, data_types.grad_accum_dtype).
struct Resolved {
  std::string error;
  std::vector<std::string> settings;
};
Resolved resolve(const std::vector<std::string>& overrides) {
  try {
    const auto c = train::load_train_config(write_config(kBase), overrides);
    const auto& o = c.optimizer;
    return {"", {o.master_precision, o.master_rounding, o.state_precision, c.grad_accum_dtype}};
  } catch (const Error& e) {
    return {e.what(), {}};
  }
}
const std::string kMasterKey = "bf16.bf16_master_weights_and_grads";
}  // namespace

// DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states over every ZeRO stage,
// optimizer offload, device and gradient dtype given: the exact settings they read as, or the
// refusal (DeepSpeed's own, or shardlm's rule for bf16 masters) naming the key and the fix.
TEST(DeepSpeedKeys, Bf16MasterKeysMapOntoShardlmsSettingsOrAreRefusedAtEveryStageOffloadAndDevice) {
  int mapped = 0, refused = 0;
  for (bool master : {false, true})
    for (bool states : {false, true})
      for (int stage : {0, 1, 2, 3})
        for (std::string offload : {"none", "cpu", "nvme"})
          for (std::string device : {"cpu", "cuda"})
            for (std::string grads : {"", "fp32", "bf16"}) {
              std::vector<std::string> ov = {"bf16.enabled=true", "device=\"" + device + "\"",
                                             "zero_optimization.stage=" + std::to_string(stage),
                                             "zero_optimization.offload_optimizer.device=\"" + offload + "\"",
                                             kMasterKey + "=" + (master ? "true" : "false"),
                                             std::string("bf16.bf16_optimizer_states=") + (states ? "true" : "false")};
              if (offload == "nvme") ov.push_back("zero_optimization.offload_optimizer.nvme_path=\"/tmp\"");
              if (!grads.empty()) ov.push_back("data_types.grad_accum_dtype=\"" + grads + "\"");
              std::string error, fix;  // parts of the expected refusal
              if (states && !master) {
                error = "bf16.bf16_optimizer_states = true needs " + kMasterKey + " = true";
                fix = "set " + kMasterKey + " to true";
              } else if (master && stage == 0) {
                error = kMasterKey + " = true needs ZeRO";
                fix = "set zero_optimization.stage to 1, 2 or 3, or " + kMasterKey + " to false";
              } else if (master && grads == "fp32" && stage == 1 && offload == "none") {
                error = kMasterKey + " = true with zero_optimization.stage 1, data_types.grad_accum_dtype \"fp32\" "
                        "and no optimizer offload is the case DeepSpeed 0.19.8 hands to its BF16_Optimizer";
                fix = "set zero_optimization.offload_optimizer.device to \"cpu\"";
              } else if (master && grads == "fp32" && stage >= 2) {
                error = kMasterKey + " = true with data_types.grad_accum_dtype \"fp32\" at zero_optimization.stage " +
                        std::to_string(stage);
                fix = "remove data_types.grad_accum_dtype";
              } else if (stage == 0 && (offload == "nvme" || (offload == "cpu" && device == "cuda"))) {
                error = "zero_optimization.offload_optimizer.device = \"" + offload + "\"";
                fix = "set zero_optimization.stage to 1, 2 or 3";
              } else if (master && device == "cuda" && offload == "none") {  // shardlm's rule, named by the key
                error = kMasterKey + " = true (read as optimizer.master_precision \"bf16\"): optimizer.master_precision "
                        "\"bf16\" on a CUDA run needs zero_optimization.offload_optimizer.device \"cpu\"";
                fix = "or " + kMasterKey + " to false";
              }
              const auto got = resolve(ov);
              std::string where;
              for (const auto& o : ov) where += " --" + o;
              if (!error.empty()) {
                ++refused;
                EXPECT_TRUE(has(got.error, error) && has(got.error, fix)) << where << "\n  got: " << got.error;
                continue;
              }
              ++mapped;
              const std::vector<std::string> want =
                  master ? std::vector<std::string>{"bf16", "nearest", states ? "bf16" : "fp32", grads.empty() ? "bf16" : grads}
                         : std::vector<std::string>{"fp32", "kahan", "fp32", grads.empty() ? "fp32" : grads};
              EXPECT_EQ(got.error, "") << where;
              EXPECT_EQ(got.settings, want) << where;
            }
  std::printf("[ bf16 keys ] %d combinations: %d mapped, %d refused\n", mapped + refused, mapped, refused);
  EXPECT_EQ(mapped + refused, 2 * 2 * 4 * 3 * 2 * 3);
}

// Where DeepSpeed refuses the key or shardlm has no equivalent: one message naming the key and the fix.
TEST(DeepSpeedKeys, Bf16MasterKeysAreRefusedWhereDeepSpeedRefusesThemOrShardlmHasNoEquivalent) {
  const std::vector<std::string> on = {"zero_optimization.stage=2", kMasterKey + "=true"};
  auto with = [&](std::vector<std::string> more, bool bf16 = true) {
    more.insert(more.begin(), on.begin(), on.end());
    if (bf16) more.push_back("bf16.enabled=true");
    return resolve(more).error;
  };
  const std::vector<std::tuple<std::vector<std::string>, bool, std::string, std::string>> cases = {
      {{}, false, kMasterKey + " = true needs bf16.enabled = true: shardlm's bf16 masters are the bf16 working shard, "
                               "so fp32 compute has none",
       "set bf16.enabled to true, or " + kMasterKey + " to false"},
      {{"fp16.enabled=true"}, false, "so fp16 compute has none", "set bf16.enabled to true"},
      {{"optimizer.type=\"Lamb\""}, true, kMasterKey + " = true with optimizer.type \"Lamb\": DeepSpeed steps bf16 "
                                            "masters only with its CPU Adam",
       "set optimizer.type to \"AdamW\", or " + kMasterKey + " to false"},
      {{"optimizer.params.torch_adam=true"}, true, kMasterKey + " = true with optimizer.params.torch_adam = true",
       "set optimizer.params.torch_adam to false, or " + kMasterKey + " to false"},
      {{"optimizer.master_precision=\"fp32\""}, true,
       "optimizer.master_precision = \"fp32\" contradicts " + kMasterKey + " = true, which means "
       "optimizer.master_precision \"bf16\"",
       "remove optimizer.master_precision"},
      {{"optimizer.master_rounding=\"kahan\""}, true,
       "optimizer.master_rounding = \"kahan\" contradicts " + kMasterKey + " = true (DeepSpeed's CPU Adam rounds each "
       "update to nearest once",
       "remove optimizer.master_rounding"},
      {{"optimizer.master_rounding=\"stochastic\""}, true, "optimizer.master_rounding = \"stochastic\" contradicts",
       "remove optimizer.master_rounding"},
      {{"optimizer.state_precision=\"bf16\""}, true,
       "optimizer.state_precision = \"bf16\" contradicts " + kMasterKey + " = true with bf16.bf16_optimizer_states = "
       "false, which means optimizer.state_precision \"fp32\"",
       "remove optimizer.state_precision"},
      {{"bf16.bf16_optimizer_states=true", "optimizer.state_precision=\"8bit\""}, true,
       "optimizer.state_precision = \"8bit\" contradicts " + kMasterKey + " = true with bf16.bf16_optimizer_states = "
       "true, which means optimizer.state_precision \"bf16\"",
       "remove optimizer.state_precision"},
      {{"optimizer.params.fp32_optimizer_states=false", "optimizer.state_precision=\"fp32\""}, true,
       "with optimizer.params.fp32_optimizer_states = false, which means optimizer.state_precision \"bf16\"",
       "remove optimizer.state_precision"},
  };
  for (const auto& [more, bf16, error, fix] : cases) {
    const std::string err = with(more, bf16);
    EXPECT_TRUE(has(err, error) && has(err, fix)) << (more.empty() ? "bf16 off" : more[0]) << ": " << err;
  }
}

// The keys read as the shardlm keys they map to: named in a notice, written to train_config.json
// with them, which reads back to the same settings; fp32_optimizer_states false gives bf16 moments
// (DeepSpeed's CPU Adam makes them in the masters' dtype), and changes nothing without the key.
TEST(DeepSpeedKeys, Bf16MasterKeysReadAsTheShardlmKeysTheyMapTo) {
  const std::vector<std::string> on = {"bf16.enabled=true", "zero_optimization.stage=3", kMasterKey + "=true",
                                       "bf16.bf16_optimizer_states=true"};
  const auto c = train::load_train_config(write_config(kBase), on);
  EXPECT_TRUE(noticed(c, kMasterKey + " true and bf16.bf16_optimizer_states true: read as optimizer.master_precision "
                      "\"bf16\", optimizer.master_rounding \"nearest\", optimizer.state_precision \"bf16\", "
                      "data_types.grad_accum_dtype \"bf16\""));
  const auto written = nlohmann::json::parse(train::config_to_json(c));
  EXPECT_EQ(written["bf16"][kMasterKey.substr(5)], true);
  EXPECT_EQ(written["bf16"]["bf16_optimizer_states"], true);
  EXPECT_EQ(written["optimizer"]["master_precision"], "bf16");
  EXPECT_EQ(written["optimizer"]["master_rounding"], "nearest");
  EXPECT_EQ(written["optimizer"]["state_precision"], "bf16");
  EXPECT_EQ(written["data_types"]["grad_accum_dtype"], "bf16");
  const auto again = train::load_train_config(write_config(written.dump()), {});
  EXPECT_EQ(train::config_to_json(again), train::config_to_json(c));
  // The same settings given as shardlm's keys alongside agree, and are taken as they are.
  EXPECT_EQ(resolve({"bf16.enabled=true", "zero_optimization.stage=2", kMasterKey + "=true",
                     "optimizer.master_precision=\"bf16\"", "optimizer.master_rounding=\"nearest\"",
                     "optimizer.state_precision=\"fp32\"", "data_types.grad_accum_dtype=\"bf16\""})
                .settings,
            (std::vector<std::string>{"bf16", "nearest", "fp32", "bf16"}));
  // Hugging Face's "auto" gradient dtype reads as DeepSpeed's default under bf16.
  EXPECT_EQ(resolve({"bf16.enabled=true", "zero_optimization.stage=2", kMasterKey + "=true",
                     "data_types.grad_accum_dtype=auto"})
                .settings,
            (std::vector<std::string>{"bf16", "nearest", "fp32", "bf16"}));
  // fp32_optimizer_states: false gives bf16 masters bf16 moments; true is overridden by bf16_optimizer_states.
  EXPECT_EQ(resolve({"bf16.enabled=true", "zero_optimization.stage=1", kMasterKey + "=true",
                     "optimizer.params.fp32_optimizer_states=false"})
                .settings,
            (std::vector<std::string>{"bf16", "nearest", "bf16", "bf16"}));
  const auto overridden = train::load_train_config(
      write_config(kBase), {"bf16.enabled=true", "zero_optimization.stage=1", kMasterKey + "=true",
                            "bf16.bf16_optimizer_states=true", "optimizer.params.fp32_optimizer_states=true"});
  EXPECT_EQ(overridden.optimizer.state_precision, "bf16");
  EXPECT_TRUE(noticed(overridden, "optimizer.params.fp32_optimizer_states true: overridden by bf16.bf16_optimizer_states"));
  const auto without = train::load_train_config(write_config(kBase), {"optimizer.params.fp32_optimizer_states=false"});
  EXPECT_EQ(without.optimizer.state_precision, "fp32");
  EXPECT_TRUE(noticed(without, "optimizer.params.fp32_optimizer_states: no effect without " + kMasterKey));
  // Both false (DeepSpeed's defaults): nothing changes.
  EXPECT_EQ(resolve({kMasterKey + "=false", "bf16.bf16_optimizer_states=false"}).settings,
            (std::vector<std::string>{"fp32", "kahan", "fp32", "fp32"}));
}
