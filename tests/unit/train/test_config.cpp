// Config parsing: DeepSpeed-style keys, overrides, and errors that name the problem and the fix.
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
#include "data/token_file.h"
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
using train::testing::error_of;
using train::testing::write_config;

const char* kBase = R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"}})";
}  // namespace

TEST(Config, ReadsDeepSpeedKeysAndOverrides) {
  auto c = train::load_train_config(
      write_config(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.8, 0.9]}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5}},
        "model": {"preset": "tiny", "num_hidden_layers": 3}, "data": {"train": "a.bin", "seq_len": 16}})"),
      {"optimizer.params.lr=0.5", "steps=7", "data.val=b.bin"});
  EXPECT_EQ(c.micro_batch, 3);
  EXPECT_EQ(c.grad_accum, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 5);
  EXPECT_EQ(c.model.num_hidden_layers, 3);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.data.val, "b.bin");
}

TEST(Config, ResolvedConfigReadsBackTheSame) {
  auto c = train::load_train_config(write_config(kBase), {"steps=3"});
  auto again = train::load_train_config(write_config(train::config_to_json(c)), {});
  EXPECT_EQ(train::config_to_json(c), train::config_to_json(again));
}

// DeepSpeed's int-typed keys (bucket sizes, stage-3 thresholds) refuse a float such as
// 9.223372036854776e+18, so train_config.json writes whole numbers as integers.
TEST(Config, ResolvedConfigWritesWholeNumbersAsIntegers) {
  const auto c = train::load_train_config(write_config(kBase), {"optimizer.params.lr=1"});
  const auto j = nlohmann::json::parse(train::config_to_json(c));
  const auto& z = j["zero_optimization"];
  EXPECT_TRUE(z["stage3_model_persistence_threshold"].is_number_integer()) << z.dump();
  EXPECT_EQ(z["stage3_model_persistence_threshold"].get<int64_t>(), std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(z["reduce_bucket_size"].is_number_integer()) << z.dump();
  EXPECT_EQ(z["reduce_bucket_size"].get<int64_t>(), 500000000);
  EXPECT_TRUE(j["optimizer"]["params"]["lr"].is_number_integer());
  EXPECT_TRUE(j["optimizer"]["params"]["eps"].is_number_float());  // 1e-8 keeps its fraction
  const auto again = train::load_train_config(write_config(j.dump()), {});
  EXPECT_DOUBLE_EQ(again.zero.stage3_model_persistence_threshold, 9.223372036854775807e18);
}

// DeepSpeed 0.19.8 removed MiCS and refuses zero_optimization.mics_shard_size as an extra key, so the
// resolved config names it only where it is on (checked against DeepSpeedZeroConfig by hand).
TEST(Config, ResolvedConfigNamesMicsOnlyWhenOn) {
  const auto off = nlohmann::json::parse(train::config_to_json(train::load_train_config(write_config(kBase), {})));
  EXPECT_FALSE(off["zero_optimization"].contains("mics_shard_size")) << off["zero_optimization"].dump();
  const auto on = nlohmann::json::parse(train::config_to_json(
      train::load_train_config(write_config(kBase), {"zero_optimization.stage=3", "zero_optimization.mics_shard_size=2"})));
  EXPECT_EQ(on["zero_optimization"]["mics_shard_size"], 2);
}

TEST(Config, UnknownTopLevelKeyListsValidKeys) {
  const auto msg = error_of(R"({"data": {"train": "x"}, "gradient_acumulation_steps": 2})");
  EXPECT_NE(msg.find("unknown config key 'gradient_acumulation_steps'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gradient_accumulation_steps"), std::string::npos) << msg;
}

TEST(Config, UnknownNestedKeysAreErrorsToo) {
  auto msg = error_of(kBase, {"optimizer.params.learning_rate=0.1"});
  EXPECT_NE(msg.find("'optimizer.params.learning_rate'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lr"), std::string::npos) << msg;
  msg = error_of(kBase, {"model.hidden=12"});
  EXPECT_NE(msg.find("unknown model field 'hidden'"), std::string::npos) << msg;
  msg = error_of(kBase, {"data.seqlen=12"});
  EXPECT_NE(msg.find("'data.seqlen'"), std::string::npos) << msg;
}

TEST(Config, WrongTypesAndValuesAreNamed) {
  EXPECT_NE(error_of(kBase, {"steps=\"many\""}).find("steps"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"model.preset=llama-9b"}).find("valid presets"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"model.num_attention_heads=5"}).find("divisible"), std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"preset": "tiny"}})").find("data.train"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"data.seq_len=4096"}).find("max_position_embeddings"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
}

TEST(Config, DeviceBackendAndAttentionAreCheckedAndResolved) {
  const auto c = train::load_train_config(write_config(kBase), {});
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.comm_backend(), "mpi");
  EXPECT_EQ(c.attn_implementation, "auto");
  const auto g = train::load_train_config(write_config(kBase), {"device=cuda"});
  EXPECT_EQ(g.comm_backend(), "nccl") << "auto picks NCCL on CUDA";
  EXPECT_EQ(train::load_train_config(write_config(kBase), {"device=cuda", "comm.backend=mpi"}).comm_backend(), "mpi");
  EXPECT_NE(error_of(kBase, {"device=gpu"}).find("\"cpu\" or \"cuda\""), std::string::npos);
  EXPECT_NE(error_of(kBase, {"comm.backend=gloo"}).find("\"auto\", \"mpi\" or \"nccl\""), std::string::npos);
  EXPECT_NE(error_of(kBase, {"comm.backend=nccl"}).find("needs device=cuda"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"attn_implementation=flash"}).find("attn_implementation"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"activation_checkpointing.mode=partial"}).find("\"none\", \"full\" or \"selective\""),
            std::string::npos);
  EXPECT_EQ(train::load_train_config(write_config(kBase), {"activation_checkpointing.mode=full"}).activation_checkpointing.mode,
            "full");
  // The resolved config carries the keys and reads back the same.
  const auto j = train::config_to_json(g);
  EXPECT_NE(j.find("\"device\": \"cuda\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"backend\": \"auto\""), std::string::npos) << j;
}

TEST(Config, InconsistentBatchSizesShowTheArithmetic) {
  auto c = train::load_train_config(write_config(kBase),
                                    {"train_batch_size=32", "train_micro_batch_size_per_gpu=4",
                                     "gradient_accumulation_steps=2"});
  EXPECT_NO_THROW(c.validate_for(4));
  try {
    c.validate_for(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 x 2 x 2 = 16"), std::string::npos) << e.what();
  }
}

// --- DeepSpeed compatibility, batch derivation, type and range validation (issues 11, 12) ---

namespace {
bool has(const std::string& msg, const std::string& needle) { return msg.find(needle) != std::string::npos; }
std::string resolve_error(const std::vector<std::string>& overrides, int world) {
  auto c = train::load_train_config(write_config(kBase), overrides);
  try {
    c.resolve_for(world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, IntegerKeysRefuseFractionsInsteadOfTruncating) {
  EXPECT_TRUE(has(error_of(kBase, {"steps=2.5"}), "steps: must be an integer, got 2.5")) << error_of(kBase, {"steps=2.5"});
  EXPECT_TRUE(has(error_of(kBase, {"data.seq_len=32.7"}), "data.seq_len: must be an integer, got 32.7"));
  EXPECT_TRUE(has(error_of(kBase, {"parallelism.pipeline_split=[1.5, 0.5]"}), "pipeline_split: every element must be an integer"));
  EXPECT_TRUE(has(error_of(kBase, {"seed=-1"}), "seed: must be >= 0"));
  EXPECT_TRUE(has(error_of(kBase, {"resume=1"}), "resume: must be true or false"));
  EXPECT_TRUE(has(error_of(kBase, {"threads=1e30"}), "threads: is out of range"));
  // An integral value written as a float is an integer (JSON writers often emit 1e3 or 4.0).
  EXPECT_EQ(train::load_train_config(write_config(kBase), {"steps=4.0", "data.seq_len=1.6e1"}).data.seq_len, 16);
}

TEST(Config, RangesAreChecked) {
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.betas=[0.9, 1.0]"}), "[0, 1)"));
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.betas=[-0.1, 0.9]"}), "[0, 1)"));
  EXPECT_TRUE(has(error_of(kBase, {"gradient_clipping=-1"}), "gradient_clipping must be >= 0"));
  EXPECT_TRUE(has(error_of(kBase, {"scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_num_steps=0"}),
                  "warmup_num_steps must be >= 1"));  // DeepSpeed 0.19.8 refuses a non-positive one
  EXPECT_TRUE(has(error_of(kBase, {"threads=-2"}), "threads must be >= 0"));
  EXPECT_TRUE(has(error_of(kBase, {"data.eval_batches=0"}), "data.eval_batches must be >= 1"));
  EXPECT_TRUE(has(error_of(kBase, {"train_micro_batch_size_per_gpu=0"}), "must be >= 1"));
  EXPECT_TRUE(has(error_of(kBase, {"train_batch_size=-8"}), "must be >= 1"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.stage3_prefetch_bucket_size=405632.5"}),
                  "stage3_prefetch_bucket_size must be a whole number of elements"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.stage3_param_persistence_threshold=-1"}),
                  "stage3_param_persistence_threshold must be a whole number of elements >= 0"));
  EXPECT_EQ(error_of(kBase, {"zero_optimization.stage3_prefetch_bucket_size=5e7"}), "");
  EXPECT_TRUE(has(error_of("[1, 2]"), "must be a JSON object"));
  EXPECT_TRUE(has(error_of("[1, 2]", {"steps=3"}), "must be a JSON object"));
}

TEST(Config, DeepSpeedZeroKeysAreReadWithDeepSpeedsMeaning) {
  const auto c = train::load_train_config(
      write_config(R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"},
        "zero_optimization": {"stage": 2, "allgather_partitions": true, "allgather_bucket_size": 2e8,
          "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8, "contiguous_gradients": true,
          "sub_group_size": 1e9, "round_robin_gradients": true, "offload_optimizer": {"device": "none"},
          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
          "stage3_gather_16bit_weights_on_model_save": true}})"),
      {});
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_DOUBLE_EQ(c.zero.reduce_bucket_size, 2e8);
  EXPECT_DOUBLE_EQ(c.zero.allgather_bucket_size, 2e8);
  EXPECT_TRUE(c.zero.round_robin_gradients);
  // Values asking for behaviour shardlm lacks are refused saying what is missing.
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.allgather_partitions=false"}), "broadcast-based gather"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.reduce_scatter=false"}), "all-reduce-based reduction"));
  // Offload: "cpu" on a CPU run is what already happens (a notice); on CUDA the optimizer's half is
  // ZeRO-Offload at stages 1-3 without pipeline or expert parallelism, the parameters' is not built;
  // parameter offload (cpu or nvme) only at stage 3, as in DeepSpeed.
  const auto cpu = train::load_train_config(write_config(kBase), {"zero_optimization.offload_optimizer={\"device\": \"cpu\", \"pin_memory\": true}"});
  EXPECT_EQ(cpu.zero.offload_optimizer.device, "cpu");
  EXPECT_TRUE(std::any_of(cpu.notices.begin(), cpu.notices.end(), [](const std::string& n) {
    return has(n, "offload_optimizer.device \"cpu\": on a CPU run the optimizer states already live in host memory");
  }));
  const auto off = error_of(kBase, {"device=cuda", "zero_optimization.offload_optimizer={\"device\": \"cpu\"}"});
  EXPECT_TRUE(has(off, "zero_optimization.offload_optimizer.device = \"cpu\" on a CUDA run needs ZeRO")) << off;
  EXPECT_TRUE(has(off, "set zero_optimization.stage to 1, 2 or 3")) << off;
  EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=cpu"}),
            "");
  // Host offload with pipeline parallelism, and NVMe offload (through the host), on a CUDA run are built.
  EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=1", "parallelism.pipeline_parallel=2",
                             "zero_optimization.offload_optimizer.device=cpu"}),
            "");
  EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=2",
                             "zero_optimization.offload_optimizer={\"device\": \"nvme\", \"nvme_path\": \"/x\"}"}),
            "");
  // Parameter offload on a CUDA run (zero_engine.h offload_param_apart): stage 3, "cpu" and "nvme" alike.
  EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu"}),
            "");
  EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=3",
                             "zero_optimization.offload_param={\"device\": \"nvme\", \"nvme_path\": \"/x\"}"}),
            "");
  // Parameter offload with NVMe optimizer offload on a GPU (ZeRO-Infinity, the paged masters cast straight into the
  // host shards), cpu and nvme alike.
  for (const char* params : {"cpu", "nvme"})
    EXPECT_EQ(error_of(kBase, {"device=cuda", "zero_optimization.stage=3",
                               std::string("zero_optimization.offload_param={\"device\": \"") + params +
                                   "\", \"nvme_path\": \"/x\"}",
                               "zero_optimization.offload_optimizer={\"device\": \"nvme\", \"nvme_path\": \"/x\"}"}),
              "")
        << params;
  // With pipeline or expert parallelism too (each engine offloads its own units), CPU and CUDA runs alike.
  for (const char* device : {"cpu", "cuda"})
    for (const char* layout : {"parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2"})
      EXPECT_EQ(error_of(kBase, {std::string("device=") + device, "zero_optimization.stage=3", layout,
                                 "zero_optimization.offload_param={\"device\": \"nvme\", \"nvme_path\": \"/x\"}"}),
                "")
          << device << " " << layout;
  const auto nvme = error_of(kBase, {"zero_optimization.stage=2",
                                     "zero_optimization.offload_param={\"device\": \"nvme\", \"nvme_path\": \"/x\"}"});
  EXPECT_TRUE(has(nvme, "zero_optimization.offload_param.device = \"nvme\" needs ZeRO stage 3")) << nvme;
  EXPECT_TRUE(has(nvme, "set zero_optimization.stage to 3")) << nvme;
  const auto no_path = error_of(kBase, {"zero_optimization.stage=3", "zero_optimization.offload_param.device=nvme"});
  EXPECT_TRUE(has(no_path, "needs zero_optimization.offload_param.nvme_path")) << no_path;
  const auto few = error_of(kBase, {"zero_optimization.stage=3",
                                    "zero_optimization.offload_param={\"device\": \"nvme\", \"nvme_path\": \"/x\", "
                                    "\"buffer_count\": 1}"});
  EXPECT_TRUE(has(few, "zero_optimization.offload_param.buffer_count = 1")) << few;
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.offload_param={\"device\": \"cpu\", \"buffer_cnt\": 4}"}),
                  "unknown config key 'zero_optimization.offload_param.buffer_cnt'"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.offload_optimizer={\"ratio\": 2}"}),
                  "zero_optimization.offload_optimizer.ratio must lie in [0, 1]"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.zero_quantized_weights=true"}), "qwZ"));
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.zero_hpz_partition_size=8"}), "hpZ"));
  // Typos stay errors that list the valid keys.
  const auto typo = error_of(kBase, {"zero_optimization.reduce_scater=true"});
  EXPECT_TRUE(has(typo, "unknown config key 'zero_optimization.reduce_scater'")) << typo;
  EXPECT_TRUE(has(typo, "reduce_scatter")) << typo;
}

TEST(Config, MissingBatchKeyIsDerivedAsDeepSpeedDoes) {
  // train_batch_size + accumulation: micro-batch = 256 / (4 x 2).
  auto c = train::load_train_config(write_config(kBase), {"train_batch_size=256", "gradient_accumulation_steps=4"});
  c.resolve_for(2);
  EXPECT_EQ(c.micro_batch, 32);
  EXPECT_EQ(c.grad_accum, 4);
  // train_batch_size + micro-batch: accumulation = 48 / (3 x 4) on tp=1.
  c = train::load_train_config(write_config(kBase), {"train_batch_size=48", "train_micro_batch_size_per_gpu=3"});
  c.resolve_for(4);
  EXPECT_EQ(c.grad_accum, 4);
  // Only train_batch_size: accumulation 1; the data-parallel size excludes the model split.
  c = train::load_train_config(write_config(kBase), {"train_batch_size=12", "parallelism.tensor_parallel=2"});
  c.resolve_for(4);
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.micro_batch, 6);
  // micro-batch + accumulation (no train_batch_size): as given.
  c = train::load_train_config(write_config(kBase), {"train_micro_batch_size_per_gpu=5", "gradient_accumulation_steps=3"});
  c.resolve_for(2);
  EXPECT_EQ(c.micro_batch * c.grad_accum, 15);
  // The resolved config reads back as the same run.
  auto again = train::load_train_config(write_config(train::config_to_json(c)), {});
  again.resolve_for(2);
  EXPECT_EQ(train::config_to_json(c), train::config_to_json(again));
  // What does not divide is refused with the arithmetic.
  auto msg = resolve_error({"train_batch_size=100", "gradient_accumulation_steps=3"}, 2);
  EXPECT_TRUE(has(msg, "train_batch_size = 100 is not divisible by gradient_accumulation_steps x data-parallel ranks = 3 x 2 = 6")) << msg;
  msg = resolve_error({"train_batch_size=10", "train_micro_batch_size_per_gpu=4"}, 2);
  EXPECT_TRUE(has(msg, "4 x 2 = 8")) << msg;
  msg = resolve_error({"train_batch_size=32", "train_micro_batch_size_per_gpu=4", "gradient_accumulation_steps=2"}, 2);
  EXPECT_TRUE(has(msg, "4 x 2 x 2 = 16")) << msg;
  // Not yet resolved is named, not reported as a batch of 0.
  c = train::load_train_config(write_config(kBase), {"train_batch_size=8"});
  try {
    c.validate_for(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "not derived yet")) << e.what();
  }
}

TEST(Config, NonFiniteLossNamesTheLikelyCausesForThisConfig) {
  auto c = train::load_train_config(write_config(kBase), {"fp16.enabled=true", "fp16.loss_scale=1024"});
  c.init = "/some/dir";
  auto msg = train::nonfinite_loss_message(c, NAN, 1, /*first_step_of_run=*/true);
  EXPECT_TRUE(has(msg, "init weights in '/some/dir'")) << msg;
  EXPECT_TRUE(has(msg, "fixed loss_scale")) << msg;
  EXPECT_TRUE(has(msg, "learning rate")) << msg;
  c = train::load_train_config(write_config(kBase), {"gradient_clipping=0"});
  msg = train::nonfinite_loss_message(c, NAN, 7, false);
  EXPECT_FALSE(has(msg, "init")) << msg;
  EXPECT_TRUE(has(msg, "gradient_clipping")) << msg;
}

TEST(Config, DeepSpeedFp16KeysAndSizesAreTyped) {
  EXPECT_NO_THROW(train::load_train_config(write_config(kBase), {"fp16.consecutive_hysteresis=false", "fp16.auto_cast=false"}));
  EXPECT_TRUE(has(error_of(kBase, {"fp16.consecutive_hysteresis=true"}), "not implemented"));
  EXPECT_TRUE(has(error_of(kBase, {"device_memory=true"}), "device_memory: must be a number of bytes or a size"));
  EXPECT_DOUBLE_EQ(train::load_train_config(write_config(kBase), {"device_memory=\"4KiB\""}).device_memory, 4096);
  EXPECT_DOUBLE_EQ(train::load_train_config(write_config(kBase), {"device_memory=4KB"}).device_memory, 4000);
}

TEST(Config, DataShuffleIsReadWrittenAndTyped) {
  EXPECT_FALSE(train::load_train_config(write_config(kBase), {}).data.shuffle);
  const auto c = train::load_train_config(write_config(kBase), {"data.shuffle=true"});
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_NE(train::config_to_json(c).find("\"shuffle\": true"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"data.shuffle=\"yes\""}).find("shuffle"), std::string::npos);
}

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

// bf16 master weights (optim/master_format.h) are built for bf16 compute with AdamW/Adam, with or
// without optimizer offload and (on a CPU run) parameter offload; on a GPU only through optimizer offload
// (the host optimizer's masters), and with parameter offload only through the host optimizer (its masters
// are the host parameter shards); every other combination names the keys and the fix.
TEST(Config, Bf16MastersRefuseCombinationsNotBuilt) {
  const std::vector<std::string> bf16 = {"optimizer.master_precision=\"bf16\""};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), bf16.begin(), bf16.end());
    return error_of(kBase, more);
  };
  EXPECT_EQ(with({"bf16.enabled=true", "optimizer.master_rounding=\"stochastic\""}), "");
  const auto fp32 = with({});
  EXPECT_TRUE(has(fp32, "needs bf16 compute") && has(fp32, "bf16.enabled")) << fp32;
  const auto fp16 = with({"fp16.enabled=true"});
  EXPECT_TRUE(has(fp16, "instead of fp16.enabled")) << fp16;
  const auto lamb = with({"bf16.enabled=true", "optimizer.type=\"Lamb\""});
  EXPECT_TRUE(has(lamb, "optimizer.type \"Lamb\" is not built")) << lamb;
  EXPECT_EQ(with({"bf16.enabled=true", "zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"cpu\""}),
            "");
  EXPECT_EQ(with({"bf16.enabled=true", "zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=\"nvme\"",
                  "zero_optimization.offload_optimizer.nvme_path=\"/tmp\""}),
            "");
  EXPECT_EQ(with({"bf16.enabled=true", "zero_optimization.stage=3", "zero_optimization.offload_param.device=\"nvme\"",
                  "zero_optimization.offload_param.nvme_path=\"/tmp\""}),
            "");
  // On a GPU the host parameter shards are the host optimizer's bf16 masters; NVMe states would page a
  // second copy of them.
  for (const char* params : {"cpu", "nvme"})
    EXPECT_EQ(with({"bf16.enabled=true", "device=\"cuda\"", "zero_optimization.stage=3",
                    "zero_optimization.offload_optimizer.device=\"cpu\"",
                    std::string("zero_optimization.offload_param.device=\"") + params + "\"",
                    "zero_optimization.offload_param.nvme_path=\"/tmp\""}),
              "")
        << params;
  const auto states = with({"bf16.enabled=true", "device=\"cuda\"", "zero_optimization.stage=3",
                            "zero_optimization.offload_optimizer.device=\"nvme\"",
                            "zero_optimization.offload_optimizer.nvme_path=\"/tmp\"",
                            "zero_optimization.offload_param.device=\"cpu\""});
  EXPECT_TRUE(has(states, "and offload_optimizer.device \"nvme\" on a CUDA run is not built") &&
              has(states, "set offload_optimizer.device to \"cpu\""))
      << states;
  const auto cuda = with({"bf16.enabled=true", "device=\"cuda\""});
  EXPECT_TRUE(has(cuda, "on a CUDA run needs zero_optimization.offload_optimizer.device \"cpu\"") &&
              has(cuda, "set offload_optimizer.device to \"cpu\""))
      << cuda;
  EXPECT_EQ(with({"bf16.enabled=true", "device=\"cuda\"", "zero_optimization.stage=1",
                  "zero_optimization.offload_optimizer.device=\"cpu\""}),
            "");
  const auto stray = error_of(kBase, {"optimizer.master_rounding=\"kahan\""});
  EXPECT_TRUE(has(stray, "applies to optimizer.master_precision \"bf16\" only")) << stray;
  const auto bad = with({"bf16.enabled=true", "optimizer.master_rounding=\"truncate\""});
  EXPECT_TRUE(has(bad, "optimizer.master_rounding must be ")) << bad;
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

// Hugging Face's "auto" (transformers' HfTrainerDeepSpeedConfig): shardlm's value of the same
// setting, HF's hidden-size formulas for the buckets, and a refusal naming the key where shardlm has
// no value; the notices say what each became.
TEST(DeepSpeedConfigs, AutoValuesTakeShardlmsValueOrHfsFormula) {
  const auto c = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32},
      "model": {"preset": "tiny", "hidden_size": 96},
      "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "gradient_clipping": "auto", "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                    "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto", "prefetch_bucket_size": "auto",
                            "stage3_gather_16bit_weights_on_model_save": "auto"}})"),
                                          {"optimizer.params.lr=2e-3"});
  const train::TrainConfig d;
  EXPECT_EQ(c.micro_batch, d.micro_batch);
  EXPECT_EQ(c.grad_accum, d.grad_accum);
  EXPECT_TRUE(c.train_batch_size_auto);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, d.gradient_clipping);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-3);  // the command line's lr replaces the file's "auto"
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, d.optimizer.beta2);  // shardlm's, not FusedAdam's 0.999
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, d.optimizer.weight_decay);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-3);  // HF: learning_rate
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1);         // HF: max(1, warmup_steps)
  EXPECT_EQ(c.scheduler.total_num_steps, 0);          // the run's steps
  EXPECT_DOUBLE_EQ(c.zero.reduce_bucket_size, 96.0 * 96);
  EXPECT_DOUBLE_EQ(c.zero.stage3_prefetch_bucket_size, 8294);  // int(0.9 * 96 * 96) = int(8294.4)
  EXPECT_DOUBLE_EQ(c.zero.stage3_param_persistence_threshold, 960);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  const auto noted = [&c](const std::string& text) {
    return std::any_of(c.notices.begin(), c.notices.end(), [&](const std::string& n) { return has(n, text); });
  };
  EXPECT_TRUE(noted("zero_optimization.reduce_bucket_size \"auto\": 9216 (Hugging Face's formula of hidden_size 96)"));
  EXPECT_TRUE(noted("optimizer.params.betas \"auto\": [0.9, 0.95] (shardlm's value)"));
  EXPECT_TRUE(noted("scheduler.params.warmup_max_lr \"auto\": 0.002 (optimizer.params.lr)"));
  // train_batch_size "auto" is the product over the job's data-parallel ranks, and written.
  auto r = c;
  r.resolve_for(2);
  EXPECT_EQ(r.train_batch_size, d.micro_batch * 2);
  EXPECT_EQ(nlohmann::json::parse(train::config_to_json(r))["train_batch_size"], d.micro_batch * 2);
  // Given next to a number, an "auto" batch key is derived from it (DeepSpeed's rule).
  auto derived = train::load_train_config(write_config(kBase), {"train_batch_size=12",
                                          "train_micro_batch_size_per_gpu=auto", "gradient_accumulation_steps=3"});
  derived.resolve_for(2);
  EXPECT_EQ(derived.micro_batch, 2);
  // Where shardlm has no value: the key and the override to give.
  const auto no_value = error_of(kBase, {"zero_optimization.reduce_scatter=auto"});
  EXPECT_TRUE(has(no_value, "zero_optimization.reduce_scatter is \"auto\", which shardlm has no value of its own"))
      << no_value;
  EXPECT_TRUE(has(no_value, "--zero_optimization.reduce_scatter=VALUE")) << no_value;
  // shardlm's own keys keep "auto" as the value it is for them.
  EXPECT_EQ(train::load_train_config(write_config(kBase), {"attn_implementation=auto"}).attn_implementation, "auto");
  EXPECT_TRUE(has(error_of(kBase, {"steps=auto"}), "steps: must be an integer"));
}

TEST(DeepSpeedConfigs, OptimizerTypesAreDeepSpeedsWithItsDefaults) {
  const auto load = [](const std::vector<std::string>& ovs) { return train::load_train_config(write_config(kBase), ovs); };
  // Naming a DeepSpeed optimizer gives its absent params DeepSpeed's defaults (FusedAdam's).
  auto adam = load({"optimizer={\"type\": \"adam\", \"params\": {\"lr\": 1e-4}}"});
  EXPECT_EQ(adam.optimizer.type, "Adam");
  EXPECT_DOUBLE_EQ(adam.optimizer.lr, 1e-4);
  EXPECT_DOUBLE_EQ(adam.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(adam.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(adam.optimizer.adam_w_mode);
  // torch_adam selects torch.optim.AdamW, whose default weight_decay is 0.01.
  EXPECT_DOUBLE_EQ(load({"optimizer={\"type\": \"AdamW\", \"params\": {\"torch_adam\": true}}"}).optimizer.weight_decay, 0.01);
  // Without an optimizer section the defaults are shardlm's.
  EXPECT_DOUBLE_EQ(load({}).optimizer.beta2, 0.95);
  const auto lamb = load({"optimizer={\"type\": \"LAMB\", \"params\": {\"max_coeff\": 0.3, \"bias_correction\": false}}"});
  EXPECT_EQ(lamb.optimizer.type, "Lamb");
  EXPECT_DOUBLE_EQ(lamb.optimizer.max_coeff, 0.3);
  EXPECT_FALSE(lamb.optimizer.bias_correction);
  const auto written = nlohmann::json::parse(train::config_to_json(lamb));
  EXPECT_EQ(written["optimizer"]["params"]["max_coeff"], 0.3);
  EXPECT_FALSE(written["optimizer"]["params"].contains("adam_w_mode"));
  // The 1-bit family the pinned DeepSpeed removed, and what shardlm lacks, are refused by name.
  for (const char* t : {"OneBitAdam", "OnebitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    const auto msg = error_of(kBase, {std::string("optimizer.type=") + t});
    EXPECT_TRUE(has(msg, std::string("optimizer.type = \"") + t + "\": the 1-bit optimizers")) << msg;
  }
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.type=SGD"}), "optimizer.type must be \"AdamW\", \"Adam\" or \"Lamb\""));
  // Lamb needs whole parameters: not under ZeRO or tensor parallelism (as DeepSpeed refuses ZeRO + Lamb).
  const auto zero = error_of(kBase, {"optimizer.type=Lamb", "zero_optimization.stage=2"});
  EXPECT_TRUE(has(zero, "optimizer.type \"Lamb\" with zero_optimization.stage 2")) << zero;
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.type=Lamb", "parallelism.tensor_parallel=2"}),
                  "optimizer.type \"Lamb\" with parallelism.tensor_parallel 2"));
  // A param the type's DeepSpeed constructor does not take is refused naming it.
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.max_coeff=1"}),
                  "optimizer.params.max_coeff is not a parameter of optimizer.type \"AdamW\""));
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.type=Lamb", "optimizer.params.adam_w_mode=false"}),
                  "optimizer.params.adam_w_mode is not a parameter of optimizer.type \"Lamb\""));
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.max_grad_norm=1"}), "gradient_clipping"));
  EXPECT_TRUE(has(error_of(kBase, {"optimizer.params.amsgrad=true"}), "AMSGrad"));
}

TEST(DeepSpeedConfigs, SchedulersTakeDeepSpeedsParamsAndDefaults) {
  const auto load = [](const std::vector<std::string>& ovs) { return train::load_train_config(write_config(kBase), ovs); };
  const auto warmup = load({"optimizer.params.lr=5e-4", "scheduler={\"type\": \"WarmupLR\"}"});
  EXPECT_DOUBLE_EQ(warmup.scheduler.warmup_max_lr, 5e-4);  // WarmupLR: the optimizer's lr
  EXPECT_EQ(warmup.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(warmup.scheduler.warmup_type, "log");
  EXPECT_DOUBLE_EQ(load({"scheduler={\"type\": \"WarmupDecayLR\"}"}).scheduler.warmup_max_lr, 1e-3);
  EXPECT_DOUBLE_EQ(load({"scheduler={\"type\": \"WarmupCosineLR\"}"}).scheduler.cos_min_ratio, 1e-4);
  EXPECT_TRUE(has(error_of(kBase, {"scheduler={\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 9}}"}),
                  "scheduler.params.total_num_steps is not a parameter of scheduler.type \"WarmupLR\""));
  EXPECT_TRUE(has(error_of(kBase, {"scheduler={\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_max_lr\": 1}}"}),
                  "scheduler.params.warmup_max_lr is not a parameter of scheduler.type \"WarmupCosineLR\""));
  EXPECT_TRUE(has(error_of(kBase, {"scheduler.type=OneCycle"}), "scheduler.type must be"));
  // Written back only the params its type takes, so train_config.json reads back.
  const auto j = nlohmann::json::parse(train::config_to_json(warmup));
  EXPECT_EQ(j["scheduler"]["params"]["warmup_max_lr"], 5e-4);
  EXPECT_FALSE(j["scheduler"]["params"].contains("cos_min_ratio"));
  EXPECT_EQ(train::config_to_json(load({"optimizer.params.lr=5e-4", "scheduler={\"type\": \"WarmupLR\"}"})),
            train::config_to_json(train::load_train_config(write_config(j.dump()), {})));
}

TEST(DeepSpeedConfigs, OlderSpellingsAndNoEffectSectionsAreReadWithANotice) {
  const auto c = train::load_train_config(write_config(R"({"data": {"train": "x.bin", "seq_len": 32},
      "model": {"preset": "tiny"}, "_comment": "a note", "bfloat16": {"enabled": true},
      "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1234, "param_persistence_threshold": 10,
                            "max_live_parameters": 0, "gather_16bit_weights_on_model_save": false,
                            "cpu_offload": true, "sub_group_size": 0},
      "steps_per_print": 7, "wall_clock_breakdown": true, "flops_profiler": {"enabled": false, "output_file": null},
      "tensor_parallel": {"autotp_size": 1}, "fp16": {"auto_cast": true},
      "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true}})"),
                                          {});
  EXPECT_TRUE(c.bf16);
  EXPECT_DOUBLE_EQ(c.zero.stage3_prefetch_bucket_size, 1234);
  EXPECT_DOUBLE_EQ(c.zero.stage3_param_persistence_threshold, 10);
  EXPECT_FALSE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");  // cpu_offload: true
  EXPECT_EQ(c.log_interval, 7);                        // steps_per_print
  for (const char* n : {"_comment: a comment", "bfloat16: read as bf16", "prefetch_bucket_size: DeepSpeed's older name",
                        "wall_clock_breakdown: accepted without effect", "flops_profiler.output_file: null",
                        "fp16.auto_cast: accepted without effect", "activation_checkpointing.cpu_checkpointing: accepted",
                        "zero_optimization.cpu_offload: DeepSpeed's older name"})
    EXPECT_TRUE(std::any_of(c.notices.begin(), c.notices.end(), [&](const std::string& s) { return has(s, n); })) << n;
  const auto old = train::load_train_config(write_config(R"({"data": {"train": "x.bin"}, "zero_optimization": true,
      "allgather_size": 300})"), {});
  EXPECT_EQ(old.zero.stage, 1);
  EXPECT_DOUBLE_EQ(old.zero.allgather_bucket_size, 300);
  // What would change the arithmetic and is not built is refused naming the key.
  EXPECT_TRUE(has(error_of(kBase, {"sparse_attention={\"mode\": \"fixed\"}"}), "sparse_attention"));
  EXPECT_TRUE(has(error_of(kBase, {"progressive_layer_drop={\"enabled\": true}"}), "progressive_layer_drop"));
  EXPECT_EQ(error_of(kBase, {"progressive_layer_drop={\"enabled\": false}"}), "");
  EXPECT_TRUE(has(error_of(kBase, {"zero_optimization.zenflow={\"topk_ratio\": 0.1}"}), "zero_optimization.zenflow"));
  // Typos in these sections stay errors.
  EXPECT_TRUE(has(error_of(kBase, {"flops_profiler.enabeld=true"}), "unknown config key 'flops_profiler.enabeld'"));
}
