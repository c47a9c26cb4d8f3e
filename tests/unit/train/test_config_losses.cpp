// Keys that used to be lost between the file and the run without a word (issue 40): each case
// here failed on the code before its fix. A model value beside `init`, a preset beside `init`,
// DeepSpeed's older `"zero_optimization": true` under a `--zero_optimization.*` override, and a model
// key missing from train_config.json (the resolved config a run writes).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config_files.h"
#include "model/hf_config_keys.h"
#include "train/config.h"
#include "util/error.h"

using namespace shardlm;

namespace {
using train::testing::error_of;
using train::testing::write_config;

// An init directory whose config.json is a tiny Mixtral (only config.json is read by the config).
std::string mixtral_init_dir() {
  const std::string d = train::testing::scratch_dir().file("mixtral_init");
  std::filesystem::create_directories(d);
  std::ofstream(d + "/config.json") << R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2})";
  return d;
}

using train::testing::has;
}  // namespace

// Before: the capacity was applied to a copy used only to compare with config.json, so the run was
// dropless (capacity 0.5 dropped 64 assignments without init and none with it).
TEST(ConfigLosses, MoeCapacityFactorBesideInitIsApplied) {
  const std::string init = mixtral_init_dir();
  const auto c = train::load_train_config(
      write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "init": ")" + init +
                   R"(", "model": {"moe_capacity_factor": 0.5}})"),
      {});
  EXPECT_EQ(c.model.model_type, "mixtral");
  EXPECT_EQ(c.model.num_experts, 4);
  EXPECT_DOUBLE_EQ(c.model.moe_capacity_factor, 0.5);
  // A shape key that contradicts config.json is still refused.
  const std::string msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "init": ")" + init +
                                   R"(", "model": {"num_hidden_layers": 3}})");
  EXPECT_TRUE(has(msg, "contradict")) << msg;
}

// Before: model.preset beside init was dropped without a word (init's config.json won).
TEST(ConfigLosses, PresetBesideInitIsNamedAsNotUsed) {
  // Before: the preset was dropped without a word. init defines the model (configs/*.json carry a
  // preset and are the usual base of an --init run), and a notice names the preset it replaced.
  const std::string init = mixtral_init_dir();
  const auto c = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "init": ")" +
                                                       init + R"(", "model": {"preset": "tiny"}})"),
                                          {});
  EXPECT_EQ(c.model.num_experts, 4) << "the model is init's";
  bool named = false;
  for (const auto& n : c.notices) named = named || (has(n, "model.preset \"tiny\": not used") && has(n, init));
  EXPECT_TRUE(named) << "a notice names the preset that init replaced";
}

// Before: the override replaced the boolean with an empty section, so the run trained at stage 0.
TEST(ConfigLosses, OlderZeroFormKeepsStageOneUnderAnOverride) {
  const std::string base = R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"},
    "zero_optimization": true})";
  auto c = train::load_train_config(write_config(base), {"zero_optimization.reduce_bucket_size=1000"});
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_DOUBLE_EQ(c.zero.reduce_bucket_size, 1000);
  c = train::load_train_config(write_config(base), {"zero_optimization.stage=2"});
  EXPECT_EQ(c.zero.stage, 2);
  // The same from the command line alone: true, then a key under it.
  c = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32}})"),
                               {"zero_optimization=true", "zero_optimization.overlap_comm=false"});
  EXPECT_EQ(c.zero.stage, 1);
  // false stays stage 0 under an override.
  c = train::load_train_config(
      write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "zero_optimization": false})"),
      {"zero_optimization.overlap_comm=false"});
  EXPECT_EQ(c.zero.stage, 0);
  // An override under a key that is not a section is named, not silently turned into one.
  const std::string msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "steps": 3})", {"steps.x=1"});
  EXPECT_TRUE(has(msg, "steps")) << msg;
}

// Before: a DeepSpeed config with a top-level key DeepSpeed itself ignores (cuda_visible_devices in
// DeepSpeedExamples' imagenet config, comms_config) was refused as an unknown key.
TEST(ConfigLosses, TopLevelKeysDeepSpeedIgnoresAreNamedNotRefused) {
  const auto c = train::load_train_config(
      write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"},
        "cuda_visible_devices": 0, "comms_config": {"verbose": false}})"),
      {});
  int named = 0;
  for (const auto& n : c.notices)
    if (n.rfind("cuda_visible_devices: ", 0) == 0 || n.rfind("comms_config: ", 0) == 0) {
      ++named;
      EXPECT_TRUE(has(n, "DeepSpeed 0.19.8")) << n;
      EXPECT_TRUE(has(n, "ignored")) << n;
    }
  EXPECT_EQ(named, 2);
  // A likely misspelling of a key at the top level is still refused, naming the key it resembles.
  std::string msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "train_micro_batch_size_per_gpus": 2})");
  EXPECT_TRUE(has(msg, "unknown config key 'train_micro_batch_size_per_gpus'")) << msg;
  EXPECT_TRUE(has(msg, "did you mean 'train_micro_batch_size_per_gpu'")) << msg;
  // Inside a section DeepSpeed validates strictly, an unknown key stays refused.
  msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "zero_optimization": {"stage": 1, "overlap_com": true}})");
  EXPECT_TRUE(has(msg, "unknown config key 'zero_optimization.overlap_com'")) << msg;
  msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "fp16": {"enabled": false, "cuda_visible_devices": 0}})");
  EXPECT_TRUE(has(msg, "unknown config key 'fp16.cuda_visible_devices'")) << msg;
}

// Before: train_config.json's model section was config.json's keys for transformers, which leave out
// shardlm's own moe_capacity_factor, so the record of a run with capacity 0.5 read back as dropless.
// Every honoured model key of each family is written (or where its value lives, named below), and the
// written config loads back to the same model.
TEST(ConfigLosses, TrainConfigJsonHoldsEveryResolvedModelKey) {
  // Keys whose value is written under another key, or that take one value only (refused otherwise).
  const std::vector<std::string> elsewhere = {
      "architectures",                     // descriptive: the family's class, from model_type
      "original_max_position_embeddings",  // inside rope_parameters / rope_scaling
      "num_local_experts",                 // qwen3_moe: written as num_experts (its other name)
      "layer_types",                       // written when given; else max_window_layers says it
      "partial_rotary_factor", "is_encoder_decoder", "add_cross_attention", "pruned_heads", "use_mrope",
      "quantization_config", "auto_map"};  // one value only, or a notice: nothing to record
  for (const std::string& type : model::hf_model_types()) {
    SCOPED_TRACE(type);
    std::string fields = R"({"preset": "tiny", "model_type": ")" + type + "\"";
    const bool is_moe = model::find_hf_config_key("moe_capacity_factor", type) != nullptr;
    if (type == "mixtral") fields += R"(, "num_local_experts": 4, "num_experts_per_tok": 2)";
    if (type == "qwen2_moe" || type == "qwen3_moe")
      fields += R"(, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32)";
    if (type == "qwen2_moe") fields += R"(, "shared_expert_intermediate_size": 48)";
    if (is_moe) fields += R"(, "moe_capacity_factor": 0.5)";
    fields += "}";
    const auto c = train::load_train_config(
        write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "model": )" + fields + "}"), {});
    const auto written = nlohmann::json::parse(train::config_to_json(c));
    const auto& m = written.at("model");
    for (const auto& e : model::hf_config_keys()) {
      if (e.use != model::KeyUse::Honoured || model::find_hf_config_key(e.key, type) != &e) continue;
      if (std::find(elsewhere.begin(), elsewhere.end(), e.key) != elsewhere.end()) continue;
      if (type == "llama" && std::string(e.key) == "sliding_window") continue;  // null only in a llama
      EXPECT_TRUE(m.contains(e.key)) << "train_config.json's model section lacks " << e.key;
    }
    if (is_moe) {
      EXPECT_EQ(m.value("moe_capacity_factor", 0.0), 0.5);
    }
    // Loaded back, the written config is the same model and writes the same file.
    const auto again = train::load_train_config(write_config(written.dump()), {});
    EXPECT_DOUBLE_EQ(again.model.moe_capacity_factor, c.model.moe_capacity_factor);
    EXPECT_EQ(train::config_to_json(again), train::config_to_json(c));
  }
}
