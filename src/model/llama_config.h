// Llama hyper-parameters under Hugging Face config.json field names, so a config.json from the Hub
// reads straight in and one we write loads in transformers. Presets cover the test model, the demo
// model and the real Llama-2 shapes the planner uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::model {

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Throws shardlm::Error naming the inconsistent fields (e.g. heads not dividing hidden size).
  void validate() const;
  // Parameter count from the shapes (what the planner and the progress line report).
  int64_t num_parameters() const;
};

// Names accepted by preset(): "tiny", "demo", "llama-1b", "llama-7b", "llama-13b", "llama-70b".
LlamaConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// `fields` holds HF config.json keys. strict: an unknown key is an error listing the valid ones
// (our own config files); otherwise keys HF writes that do not change the math are ignored
// (config.json from the Hub). Either way, settings we cannot honour (rope_scaling, biases,
// another activation) are refused.
void apply_hf_fields(LlamaConfig& cfg, const nlohmann::json& fields, bool strict, const std::string& where);
LlamaConfig read_hf_config(const std::string& path);
nlohmann::json to_hf_json(const LlamaConfig& cfg);
void write_hf_config(const std::string& path, const LlamaConfig& cfg);

}  // namespace shardlm::model
