// DeepSpeed config files as users bring them: Hugging Face's "auto" values, DeepSpeed's optimizer
// and scheduler types with their defaults, older spellings and no-effect sections. Split from
// test_config.cpp (issue 40: one job per file); same test binary, same test names.
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
