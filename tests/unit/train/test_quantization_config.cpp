// The quantization section (QLoRA's 4-bit base, docs/qlora.md): transformers' BitsAndBytesConfig keys
// read with their meanings, its to_dict() form read unchanged, and what is not built refused in one
// message naming the key and the fix.
#include <gtest/gtest.h>

#include "config_files.h"
#include "train/config.h"

using namespace shardlm;
using train::testing::error_of;
using train::testing::write_config;

namespace {

// A 4-bit base is frozen, so every case trains LoRA adapters on it (the last test: without them, refused).
const char* kModel = R"("data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"}, "lora": {"enabled": true}, )";

std::string with(const std::string& quantization, const std::string& rest = "") {
  return std::string("{") + kModel + rest + R"("quantization": )" + quantization + "}";
}

}  // namespace

TEST(QuantizationConfig, ReadsTheBitsAndBytesKeys) {
  const auto c = train::load_train_config(
      write_config(with(R"({"load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
                            "bnb_4bit_compute_dtype": "float32"})")),
      {});
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_EQ(c.quantization.bnb_4bit_quant_type, "nf4");
  EXPECT_TRUE(c.quantization.bnb_4bit_use_double_quant);
  const auto d = train::load_train_config(write_config("{" + std::string(kModel) + R"("steps": 1})"), {});
  EXPECT_FALSE(d.quantization.load_in_4bit);
  EXPECT_EQ(d.quantization.bnb_4bit_quant_type, "fp4");  // transformers' default
}

TEST(QuantizationConfig, ReadsTransformersToDictUnchanged) {
  // BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
  // bnb_4bit_compute_dtype=torch.float32).to_dict(), as transformers 5.23 writes it.
  const auto c = train::load_train_config(write_config(with(R"({"quant_method": "bitsandbytes", "_load_in_8bit": false,
      "_load_in_4bit": true, "llm_int8_threshold": 6.0, "llm_int8_skip_modules": null,
      "llm_int8_enable_fp32_cpu_offload": false, "llm_int8_has_fp16_weight": false, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
      "load_in_4bit": true, "load_in_8bit": false})")), {});
  EXPECT_TRUE(c.quantization.load_in_4bit);
  EXPECT_FALSE(c.quantization.load_in_8bit);
}

TEST(QuantizationConfig, RefusesWhatIsNotBuiltByName) {
  EXPECT_NE(error_of(with(R"({"load_in_8bit": true})")).find("quantization.load_in_8bit"), std::string::npos);
  EXPECT_NE(error_of(with(R"({"_load_in_8bit": true})")).find("quantization.load_in_8bit"), std::string::npos);
  EXPECT_NE(error_of(with(R"({"load_in_4bit": true, "bnb_4bit_quant_type": "int4"})")).find("bnb_4bit_quant_type"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"({"llm_int8_skip_modules": ["mlp"]})")).find("quantization.llm_int8_skip_modules"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"({"llm_int8_enable_fp32_cpu_offload": true})")).find("llm_int8_enable_fp32_cpu_offload"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"({"bnb_4bit_quant_storage": "bfloat16"})")).find("bnb_4bit_quant_storage"), std::string::npos);
  EXPECT_NE(error_of(with(R"({"bnb_4bit_use_double_quantization": true})")).find("bnb_4bit_use_double_quantization"),
            std::string::npos);
}

TEST(QuantizationConfig, RefusesAComputeDtypeOtherThanTheRunsAndTensorParallelism) {
  const auto dtype = error_of(with(R"({"load_in_4bit": true, "bnb_4bit_compute_dtype": "bfloat16"})"));
  EXPECT_NE(dtype.find("quantization.bnb_4bit_compute_dtype"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("float32"), std::string::npos) << dtype;
  EXPECT_EQ(error_of(with(R"({"load_in_4bit": true, "bnb_4bit_compute_dtype": "bfloat16"})", R"("bf16": {"enabled": true}, )")),
            "");
  const auto tp = error_of(with(R"({"load_in_4bit": true})", R"("parallelism": {"tensor_parallel": 2}, )"));
  EXPECT_NE(tp.find("quantization.load_in_4bit with parallelism.tensor_parallel 2"), std::string::npos) << tp;
}

TEST(QuantizationConfig, RefusesA4BitBaseWithoutLora) {
  const auto msg = error_of(R"({"data": {"train": "x.bin", "seq_len": 32}, "model": {"preset": "tiny"},
      "quantization": {"load_in_4bit": true}})");
  EXPECT_NE(msg.find("quantization.load_in_4bit without lora.enabled"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set lora.enabled to true"), std::string::npos) << msg;
}
