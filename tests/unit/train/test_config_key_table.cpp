// The config key table (config_keys.h, issue 22): unknown-key lists, defaults, choices, range and
// refusal errors, the resolved config and the docs all derive from it. Split from test_config.cpp
// (issue 40: one job per file); same test binary, same test names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "../data/test_helpers.h"
#include "config_files.h"
#include "data/loader/token_file.h"
#include "model/attention.h"
#include "model/fp32_products.h"
#include "model/recompute.h"
#include "optim/master_format.h"
#include "parallel/pipeline/schedule.h"
#include "plan/planner.h"
#include "train/config.h"
#include "train/config_keys.h"
#include "train/nonfinite.h"
#include "train/plan_check.h"
#include "util/error.h"

using namespace shardlm;

namespace {
using train::testing::kBase;
using train::testing::has;
using train::testing::error_of;
using train::testing::write_config;

}  // namespace

// --- The key table (config_keys.h, issue 22): parsing, checks, defaults and docs derive from it ---

namespace {
// "optimizer.params" -> the names the table lists under it, in its order (keys and sub-sections).
std::vector<std::string> table_names_in(const std::string& section) {
  std::vector<std::string> names;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& k : train::config_keys()) {
    if (k.path.rfind(prefix, 0) != 0) continue;
    const std::string rest = k.path.substr(prefix.size());
    const std::string name = rest.substr(0, rest.find('.'));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

TEST(ConfigKeys, UnknownKeyErrorsListExactlyTheTablesNames) {
  std::vector<std::string> sections = {""};
  for (const auto& k : train::config_keys())
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1))
      if (std::find(sections.begin(), sections.end(), k.path.substr(0, dot)) == sections.end())
        sections.push_back(k.path.substr(0, dot));
  EXPECT_GE(sections.size(), 14u);
  for (const auto& section : sections) {
    // At the top level only a likely misspelling is refused (DeepSpeed ignores other keys there, and
    // shardlm names them: test_config_losses.cpp).
    const std::string key = section.empty() ? "stepz" : section + ".no_such_key";
    const auto msg = error_of(kBase, {key + "=1"});
    const std::string listed = section.empty() ? " (did you mean 'steps'?). Valid keys: " : ". Valid keys in " + section + ": ";
    EXPECT_TRUE(has(msg, "unknown config key '" + key + "'" + listed + joined(table_names_in(section))))
        << section << ": " << msg;
  }
}

TEST(ConfigKeys, DefaultsAreTheStructsAndPassTheirOwnChecks) {
  const train::TrainConfig defaults;
  int checked = 0;
  for (const auto& k : train::config_keys()) {
    if (!k.get || k.optional) continue;
    const auto v = k.get(defaults);
    if (!k.range.empty() && v.is_number()) {
      EXPECT_TRUE(k.range.holds(v.get<double>())) << k.path << " default " << v.dump() << " " << k.range.predicate();
      ++checked;
    }
    if (!k.choices.empty()) {
      bool listed = false;
      for (const auto& c : k.choices) listed = listed || c.first == v;
      EXPECT_TRUE(listed) << k.path << " default " << v.dump() << " is not one of its choices";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
  // A config of only the required keys parses to the defaults (apart from what it gives).
  auto c = train::load_train_config(write_config(R"({"data": {"train": "x.bin"}})"), {});
  EXPECT_EQ(c.micro_batch, defaults.micro_batch);
  EXPECT_EQ(c.data.seq_len, defaults.data.seq_len);
  EXPECT_DOUBLE_EQ(c.zero.reduce_bucket_size, defaults.zero.reduce_bucket_size);
  EXPECT_EQ(c.model_preset, train::kDefaultModelPreset);
}

TEST(ConfigKeys, ModelFieldsOnAPresetAreNamedAsSuchAndPlannedAsWritten) {
  // A preset with model fields is no longer the preset: the record says so, and the config the
  // planner emits for it carries the fields rather than the preset's name.
  const auto c = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32},
      "model": {"preset": "tiny", "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}})"), {});
  EXPECT_EQ(c.model_preset, "mixtral (tiny preset + 3 model fields)");
  auto r = train::plan_request(c, 1, 0, c.micro_batch);
  const auto emitted = plan::recommended_config(plan::make_plan(r));
  EXPECT_FALSE(emitted["model"].contains("preset")) << emitted["model"].dump();
  EXPECT_EQ(emitted["model"]["model_type"], "mixtral");
  EXPECT_EQ(emitted["model"]["num_local_experts"], 4);
  const auto plain = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32},
      "model": {"preset": "tiny"}})"), {});
  EXPECT_EQ(plain.model_preset, "tiny");
  EXPECT_EQ(plan::recommended_config(plan::make_plan(train::plan_request(plain, 1, 0, 1)))["model"]["preset"], "tiny");
}

TEST(ConfigKeys, EveryChoiceIsAcceptedAndTheDomainParsersAgree) {
  for (const auto& k : train::config_keys()) {
    for (const auto& [value, what] : k.choices) {
      std::vector<std::string> ovs = {k.path + "=" + value.dump()};
      if (k.path == "comm.backend" || k.path == "device") ovs.push_back("device=cuda");
      if (k.path == "device" && value == "cpu") ovs = {"device=cpu"};
      if (k.path == "zero_optimization.offload_optimizer.device" && value == "nvme")  // what NVMe offload needs
        ovs.insert(ovs.end(), {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.nvme_path=\"/tmp\""});
      if (k.path == "zero_optimization.offload_param.device" && value != "none")  // stage 3 (and a directory)
        ovs.insert(ovs.end(), {"zero_optimization.stage=3", "zero_optimization.offload_param.nvme_path=\"/tmp\""});
      if (k.path == "optimizer.master_precision" && value == "bf16") ovs.push_back("bf16.enabled=true");
      if (k.path.rfind("lora.", 0) == 0) ovs.push_back("lora.enabled=true");  // lora keys need it
      if (k.path == "optimizer.master_rounding")  // applies to bf16 masters, which need bf16 compute
        ovs.insert(ovs.end(), {"optimizer.master_precision=\"bf16\"", "bf16.enabled=true"});
      EXPECT_EQ(error_of(kBase, ovs), "") << k.path << " = " << value.dump();
    }
    if (!k.choices.empty()) {
      const std::string other = k.choices.front().first.is_string() ? "\"no-such-value\"" : "99";
      EXPECT_TRUE(has(error_of(kBase, {k.path + "=" + other}), k.path + " must be ")) << error_of(kBase, {k.path + "=" + other});
    }
  }
  // The layers that read these strings accept every value the table allows.
  const auto choices = [](const std::string& path) {
    std::vector<std::string> out;
    for (const auto& k : train::config_keys())
      if (k.path == path)
        for (const auto& c : k.choices) out.push_back(c.first.get<std::string>());
    EXPECT_FALSE(out.empty()) << path;
    return out;
  };
  for (const auto& v : choices("data.format")) EXPECT_NO_THROW(data::parse_token_format(v)) << v;
  for (const auto& v : choices("attn_implementation")) EXPECT_NO_THROW(model::parse_attention(v)) << v;
  for (const auto& v : choices("activation_checkpointing.mode")) EXPECT_NO_THROW(model::parse_recompute(v)) << v;
  for (const auto& v : choices("bf16.cpu_products")) EXPECT_NO_THROW(model::parse_bf16_products(v)) << v;
  for (const auto& v : choices("parallelism.pipeline_schedule")) EXPECT_NO_THROW(parallel::pp::parse_schedule(v)) << v;
  for (const auto& v : choices("optimizer.master_precision")) EXPECT_NO_THROW(optim::parse_master_format(v, "kahan")) << v;
  for (const auto& v : choices("optimizer.master_rounding")) EXPECT_NO_THROW(optim::parse_master_format("bf16", v)) << v;
}

TEST(ConfigKeys, RangeErrorsNameKeyRuleAndValue) {
  EXPECT_TRUE(has(error_of(kBase, {"eval_interval=-1"}), "eval_interval must be >= 0, got -1"));
  EXPECT_TRUE(has(error_of(kBase, {"log_interval=0"}), "log_interval must be >= 1, got 0"));
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.eps=0"}), "optimizer.params.eps must be > 0, got 0"));
  EXPECT_TRUE(has(error_of(kBase, {"scheduler.params.cos_min_ratio=1.5"}),
                  "scheduler.params.cos_min_ratio must lie in [0, 1], got 1.5"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.stage=4"}), "zero_optimization.stage must be 0, 1, 2 or 3, got 4"));
  EXPECT_TRUE(has(error_of(kBase, {"data.format=\"bin\""}), "data.format must be \"llmc\", \"raw_u16\" or \"raw_u32\""));
  EXPECT_TRUE(has(error_of(kBase, {"data.format=\"bin\""}), "bare uint16 ids"));
  // fp16's scaler keys are checked only with fp16 on (as the scaler reads them only then).
  EXPECT_EQ(error_of(kBase, {"fp16.hysteresis=0"}), "");
  EXPECT_TRUE(has(error_of(kBase, {"fp16.enabled=true", "fp16.hysteresis=0"}), "fp16.hysteresis must be >= 1, got 0"));
  // The older DeepSpeed name sets the same field as the current one.
  EXPECT_FALSE(train::load_train_config(write_config(kBase), {"zero_optimization.stage3_gather_fp16_weights_on_model_save=false"})
                   .zero.stage3_gather_16bit_weights_on_model_save);
}

TEST(ConfigKeys, RefusedDeepSpeedKeysNameTheKeyAndTheMissingFeature) {
  int refused = 0;
  for (const auto& k : train::config_keys()) {
    if (k.deepspeed != train::DeepSpeed::Refused) continue;
    ++refused;
    const auto msg = error_of(kBase, {k.path + "=\"on\""});  // a string turns no feature off
    EXPECT_TRUE(has(msg, k.path + " = \"on\": " + k.why)) << msg;
    EXPECT_FALSE(has(msg, "unknown")) << msg;
  }
  EXPECT_GE(refused, 14);
}

TEST(ConfigKeys, TheResolvedConfigWritesEveryKeyAndReadsBack) {
  const auto c = train::load_train_config(write_config(kBase), {"debug.consistency_interval=3", "init="});
  const auto j = nlohmann::json::parse(train::config_to_json(c));
  for (const auto& k : train::config_keys()) {
    if (!k.get || k.deepspeed == train::DeepSpeed::Alias || k.optional || k.path == "init") continue;
    if (k.path == "zero_optimization.mics_shard_size") continue;  // written only when on (next test)
    if (k.path.rfind("lora.", 0) == 0 && k.path != "lora.enabled") continue;  // a LoRA run's (next test)
    const auto ptr = nlohmann::json::json_pointer("/" + std::regex_replace(k.path, std::regex("\\."), "/"));
    EXPECT_TRUE(j.contains(ptr)) << k.path << " is not in train_config.json";
  }
  EXPECT_EQ(j["debug"]["consistency_interval"], 3);
  EXPECT_FALSE(j.contains("train_batch_size")) << "written only when given";
}

TEST(ConfigKeys, MarkdownHasOneRowPerKey) {
  const auto md = train::config_keys_markdown();
  EXPECT_EQ(std::count(md.begin(), md.end(), '\n'), static_cast<long>(train::config_keys().size()) + 2);
  for (const auto& k : train::config_keys()) EXPECT_TRUE(has(md, "| `" + k.path + "` |")) << k.path;
  EXPECT_TRUE(has(md, "| `zero_optimization.reduce_bucket_size` | number | `5e8` | > 0 (elements) | same |")) << md;
}

// The planner's request defaults (what `shardlm plan` predicts without a config) are the trainer's
// for every setting the two share, and the emitted config restates the trainer's optimizer defaults:
// a planner default that drifts (reduce_bucket_size was once 0 there and 5e8 here) fails here.
TEST(ConfigKeys, PlannerDefaultsAreTheTrainersDefaults) {
  train::TrainConfig cfg;
  cfg.model = model::preset("tiny");
  const plan::PlanRequest planner;
  const auto trainer = train::plan_request(cfg, 1, cfg.zero.stage, cfg.micro_batch);
  EXPECT_DOUBLE_EQ(planner.reduce_bucket, trainer.reduce_bucket);
  EXPECT_DOUBLE_EQ(planner.prefetch, trainer.prefetch);
  EXPECT_DOUBLE_EQ(planner.persistence_threshold, trainer.persistence_threshold);
  EXPECT_EQ(planner.pipeline_schedule, trainer.pipeline_schedule);
  EXPECT_EQ(planner.recompute, trainer.recompute);
  EXPECT_EQ(planner.grad_accum_dtype, trainer.grad_accum_dtype);
  EXPECT_EQ(planner.sequence_parallel, trainer.sequence_parallel);
  EXPECT_EQ(planner.tp, trainer.tp);
  EXPECT_EQ(planner.pp, trainer.pp);
  EXPECT_EQ(planner.accumulation, trainer.accumulation);
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.seq_len = 32;
  const auto emitted = plan::recommended_config(plan::make_plan(r));
  const auto defaults = nlohmann::json::parse(train::config_to_json(cfg));
  EXPECT_EQ(emitted["optimizer"], defaults["optimizer"]);
  EXPECT_EQ(emitted["gradient_clipping"], defaults["gradient_clipping"]);
}
