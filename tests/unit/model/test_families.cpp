// The family descriptors (model/family.h) against what the code answered before they existed (the
// model_type comparisons they replaced): the table's families in their order, each family's class
// name, the config.json keys each reads beyond every family's (the old families column, spelled out
// here), what its decoder asks (biases, q/k norms, windows, experts) and what it refuses. The math
// itself is proved against transformers by tests/family and the config.json reading by
// test_hf_configs.py; this pins the descriptors so that a changed one fails here by name.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/hf_config_keys.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "util/error.h"
#include "../../support/error_of.h"

using namespace shardlm;
using shardlm::test_support::error_of;

namespace {

model::LlamaConfig tiny(const std::string& type, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"model_type", type},         {"vocab_size", 64},        {"hidden_size", 32},
                      {"intermediate_size", 48},    {"num_hidden_layers", 4},  {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},   {"max_position_embeddings", 64}};
  if (type == "mixtral") j["num_local_experts"] = 4;
  if (type == "qwen2_moe" || type == "qwen3_moe")
    j.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}});
  if (type == "qwen2_moe") j["shared_expert_intermediate_size"] = 24;
  j.update(extra);
  return model::hf_config_from_json(j, "test");
}

}  // namespace

TEST(Families, TableOrderAndClassNames) {
  const std::vector<std::pair<std::string, std::string>> want = {
      {"llama", "LlamaForCausalLM"},       {"mistral", "MistralForCausalLM"},     {"qwen2", "Qwen2ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},   {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  ASSERT_EQ(model::families().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(model::families()[i]->model_type, want[i].first);
    EXPECT_EQ(model::hf_model_types()[i], want[i].first);
    EXPECT_EQ(tiny(want[i].first).architecture(), want[i].second);
  }
  const std::string e = error_of([] { model::family("gpt2"); });
  EXPECT_NE(e.find("model_type \"gpt2\" is not a family shardlm reads (llama, mistral, qwen2, mixtral, qwen2_moe, "
                   "qwen3, qwen3_moe)"), std::string::npos) << e;
}

// The families column of every per-family key, as hf_config_keys.cpp spelled it before the descriptors.
TEST(Families, KeysEachFamilyReads) {
  const std::map<std::string, std::string> want = {
      {"attention_bias", "llama qwen3 qwen3_moe"},
      {"mlp_bias", "llama"},
      {"use_sliding_window", "qwen2 qwen2_moe qwen3 qwen3_moe"},
      {"max_window_layers", "qwen2 qwen2_moe qwen3 qwen3_moe"},
      {"layer_types", "qwen2 qwen2_moe qwen3 qwen3_moe"},
      {"qkv_bias", "qwen2_moe"},
      {"num_local_experts", "mixtral qwen3_moe"},
      {"num_experts", "qwen2_moe qwen3_moe"},
      {"num_experts_per_tok", "mixtral qwen2_moe qwen3_moe"},
      {"norm_topk_prob", "qwen2_moe qwen3_moe"},
      {"moe_intermediate_size", "qwen2_moe qwen3_moe"},
      {"shared_expert_intermediate_size", "qwen2_moe"},
      {"decoder_sparse_step", "qwen2_moe qwen3_moe"},
      {"mlp_only_layers", "qwen2_moe qwen3_moe"},
      {"router_aux_loss_coef", "mixtral qwen2_moe qwen3_moe"},
      {"output_router_logits", "mixtral qwen2_moe qwen3_moe"},
      {"router_jitter_noise", "mixtral"},
      {"moe_capacity_factor", "mixtral qwen2_moe qwen3_moe"},
      {"use_mrope", "qwen2"}};
  std::map<std::string, std::string> got;
  for (const auto& k : model::hf_config_keys())
    if (k.per_family) got[k.key] = model::hf_config_key_families(k);
  EXPECT_EQ(got, want);
  // A per-family key is found for the families that list it, and only for them.
  EXPECT_NE(model::find_hf_config_key("attention_bias", "qwen3"), nullptr);
  EXPECT_EQ(model::find_hf_config_key("attention_bias", "qwen2"), nullptr);
  EXPECT_NE(model::find_hf_config_key("vocab_size", "mistral"), nullptr);
}

TEST(Families, WhatTheDecoderAsks) {
  // q/k/v and o biases: attention_bias where it is the family's key; qwen2 always (q/k/v); qwen2_moe by qkv_bias.
  EXPECT_TRUE(tiny("llama", {{"attention_bias", true}}).has_o_bias());
  EXPECT_TRUE(tiny("qwen3", {{"attention_bias", true}}).has_qkv_bias());
  EXPECT_FALSE(tiny("llama").has_qkv_bias());
  EXPECT_TRUE(tiny("qwen2").has_qkv_bias());
  EXPECT_FALSE(tiny("qwen2").has_o_bias());
  EXPECT_TRUE(tiny("qwen2_moe").has_qkv_bias());
  EXPECT_FALSE(tiny("qwen2_moe", {{"qkv_bias", false}}).has_qkv_bias());
  EXPECT_FALSE(tiny("qwen2_moe").has_o_bias());
  for (const std::string t : {"qwen3", "qwen3_moe"}) EXPECT_TRUE(tiny(t).has_qk_norm()) << t;
  for (const std::string t : {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe"}) EXPECT_FALSE(tiny(t).has_qk_norm()) << t;
  // Windows: mistral and mixtral on every layer, qwen2 from max_window_layers on, the others none.
  EXPECT_EQ(tiny("mistral", {{"sliding_window", 8}}).window_of_layer(0), 8);
  EXPECT_EQ(tiny("mixtral", {{"sliding_window", 8}}).window_of_layer(3), 8);
  const auto qwen2 = tiny("qwen2", {{"sliding_window", 8}, {"use_sliding_window", true}, {"max_window_layers", 2}});
  EXPECT_EQ(qwen2.window_of_layer(1), 0);
  EXPECT_EQ(qwen2.window_of_layer(2), 8);
  EXPECT_EQ(tiny("qwen3", {{"sliding_window", 8}}).window_of_layer(3), 0);
  // Experts: mixtral's are intermediate_size wide on every layer; the Qwen MoE families' by step.
  const auto mixtral = tiny("mixtral");
  EXPECT_EQ(mixtral.expert_intermediate_size(), 48);
  EXPECT_TRUE(mixtral.is_moe_layer(2));
  const auto qwen3_moe = tiny("qwen3_moe", {{"decoder_sparse_step", 2}});
  EXPECT_EQ(qwen3_moe.expert_intermediate_size(), 16);
  EXPECT_FALSE(qwen3_moe.is_moe_layer(0));
  EXPECT_TRUE(qwen3_moe.is_moe_layer(1));
  EXPECT_TRUE(model::family("qwen3_moe").router_after_experts);
  EXPECT_FALSE(model::family("qwen2_moe").router_after_experts);
  EXPECT_STREQ(model::family("mixtral").expert_files.block, "block_sparse_moe");
  EXPECT_STREQ(model::family("qwen2_moe").expert_files.block, "mlp");
}

TEST(Families, WhatEachRefuses) {
  auto refused = [](const std::string& type, const nlohmann::json& extra) {
    return error_of([&] { tiny(type, extra); });
  };
  EXPECT_NE(refused("llama", {{"sliding_window", 8}}).find("in a llama config"), std::string::npos);
  EXPECT_NE(refused("qwen3", {{"use_sliding_window", true}}).find("use_sliding_window true in a qwen3 config"),
            std::string::npos);
  EXPECT_NE(refused("qwen2", {{"layer_types", {"full_attention", "sliding_attention", "full_attention",
                                               "full_attention"}}}).find("use_sliding_window is false"),
            std::string::npos);
  EXPECT_NE(refused("mixtral", {{"num_local_experts", 0}}).find("num_local_experts must be positive for mixtral"),
            std::string::npos);
  EXPECT_NE(refused("qwen2_moe", {{"shared_expert_intermediate_size", 0}})
                .find("shared_expert_intermediate_size must be positive for qwen2_moe"),
            std::string::npos);
  // Dense forms: qwen2_moe and qwen3_moe with no experts are dense in transformers too.
  EXPECT_FALSE(tiny("qwen3_moe", {{"num_experts", 0}}).is_moe());
  // llama: hidden_size must divide by the heads even with head_dim given; the others only derive head_dim.
  EXPECT_NE(refused("llama", {{"hidden_size", 30}, {"head_dim", 8}}).find("not divisible"), std::string::npos);
  EXPECT_EQ(tiny("mistral", {{"hidden_size", 30}, {"head_dim", 8}}).head_dim(), 8);
}

// PEFT 0.22.0's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft/utils/constants.py): q_proj and
// v_proj for the dense families and mixtral; no entry for qwen2_moe and qwen3_moe, where PEFT asks for
// target_modules, and so does shardlm, naming the key.
TEST(Families, PeftDefaultLoraTargets) {
  for (const char* type : {"llama", "mistral", "qwen2", "qwen3", "mixtral"})
    EXPECT_EQ(model::default_lora_targets(type), (std::vector<std::string>{"q_proj", "v_proj"})) << type;
  for (const char* type : {"qwen2_moe", "qwen3_moe"})
    EXPECT_NE(error_of([&] { model::default_lora_targets(type); }).find("lora.target_modules: PEFT has no default"),
              std::string::npos)
        << type;
  EXPECT_EQ(model::families().size(), 7u) << "a new family states PEFT's default LoRA targets here too";
}
