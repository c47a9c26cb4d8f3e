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
