// Config parsing: DeepSpeed-style keys, overrides, and errors that name the problem and the fix.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "../data/test_helpers.h"
#include "train/config.h"
#include "util/error.h"

using namespace shardlm;

namespace {
std::string write_config(const std::string& text) {
  static const data::testing::TempDir dir;  // removed when the test program ends
  static int n = 0;
  const std::string path = dir.file("config_" + std::to_string(n++) + ".json");
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    train::load_train_config(write_config(text), overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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
