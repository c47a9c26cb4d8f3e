// HF config.json <-> LlamaConfig, presets and validation.
#include "model/llama_config.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace shardlm::model {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

void LlamaConfig::validate() const {
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_hidden_layers <= 0 ||
      num_attention_heads <= 0 || num_key_value_heads <= 0 || max_position_embeddings <= 0)
    fail("model config: sizes must be positive (vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
         "num_attention_heads, num_key_value_heads, max_position_embeddings)");
  if (hidden_size % num_attention_heads != 0)
    fail("model config: hidden_size ", hidden_size, " is not divisible by num_attention_heads ", num_attention_heads);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("model config: num_attention_heads ", num_attention_heads, " is not a multiple of num_key_value_heads ",
         num_key_value_heads, " (grouped-query attention shares each key/value head among a whole group)");
  if (head_dim() % 2 != 0) fail("model config: head_dim ", head_dim(), " must be even for rotary embeddings");
  if (rms_norm_eps <= 0 || rope_theta <= 0) fail("model config: rms_norm_eps and rope_theta must be positive");
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t h = hidden_size, kv = num_key_value_heads * head_dim();
  const int64_t per_layer = h * h * 2 + h * kv * 2 + 3 * h * intermediate_size + 2 * h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + h;
}

LlamaConfig preset(const std::string& name) {
  LlamaConfig c;
  if (name == "tiny") {  // the parity-test model (tests/golden/tiny)
    c.vocab_size = 128; c.hidden_size = 64; c.intermediate_size = 176; c.num_hidden_layers = 2;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.max_position_embeddings = 128;
  } else if (name == "demo") {  // ~12.6M parameters: learns visibly in minutes on 2 CPU cores
    c.vocab_size = 4096; c.hidden_size = 384; c.intermediate_size = 1024; c.num_hidden_layers = 6;
    c.num_attention_heads = 6; c.num_key_value_heads = 2; c.max_position_embeddings = 1024;
  } else if (name == "llama-1b") {  // TinyLlama-1.1B's shape: the GPU speed check's model
    c.vocab_size = 32000; c.hidden_size = 2048; c.intermediate_size = 5632; c.num_hidden_layers = 22;
    c.num_attention_heads = 32; c.num_key_value_heads = 4; c.max_position_embeddings = 2048;
  } else if (name == "llama-7b") {
    c.vocab_size = 32000; c.hidden_size = 4096; c.intermediate_size = 11008; c.num_hidden_layers = 32;
    c.num_attention_heads = 32; c.num_key_value_heads = 32; c.max_position_embeddings = 4096;
  } else if (name == "llama-13b") {
    c.vocab_size = 32000; c.hidden_size = 5120; c.intermediate_size = 13824; c.num_hidden_layers = 40;
    c.num_attention_heads = 40; c.num_key_value_heads = 40; c.max_position_embeddings = 4096;
  } else if (name == "llama-70b") {
    c.vocab_size = 32000; c.hidden_size = 8192; c.intermediate_size = 28672; c.num_hidden_layers = 80;
    c.num_attention_heads = 64; c.num_key_value_heads = 8; c.max_position_embeddings = 4096;
  } else {
    fail("unknown model preset '", name, "'; valid presets: ", join(preset_names()));
  }
  return c;
}

std::vector<std::string> preset_names() { return {"tiny", "demo", "llama-1b", "llama-7b", "llama-13b", "llama-70b"}; }

void apply_hf_fields(LlamaConfig& c, const nlohmann::json& j, bool strict, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected a JSON object of model fields");
  auto get_int = [&](const std::string& k, int64_t& dst) {
    if (!j[k].is_number_integer()) fail(where, ": '", k, "' must be an integer, got ", j[k].dump());
    dst = j[k].get<int64_t>();
  };
  auto get_num = [&](const std::string& k, double& dst) {
    if (!j[k].is_number()) fail(where, ": '", k, "' must be a number, got ", j[k].dump());
    dst = j[k].get<double>();
  };
  const std::vector<std::string> valid = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                          "rms_norm_eps", "rope_theta", "tie_word_embeddings", "initializer_range",
                                          "bos_token_id", "eos_token_id", "hidden_act", "rope_scaling",
                                          "attention_bias"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "vocab_size") get_int(k, c.vocab_size);
    else if (k == "hidden_size") get_int(k, c.hidden_size);
    else if (k == "intermediate_size") get_int(k, c.intermediate_size);
    else if (k == "num_hidden_layers") get_int(k, c.num_hidden_layers);
    else if (k == "num_attention_heads") get_int(k, c.num_attention_heads);
    else if (k == "num_key_value_heads") get_int(k, c.num_key_value_heads);
    else if (k == "max_position_embeddings") get_int(k, c.max_position_embeddings);
    else if (k == "rms_norm_eps") get_num(k, c.rms_norm_eps);
    else if (k == "rope_theta") get_num(k, c.rope_theta);
    else if (k == "initializer_range") get_num(k, c.initializer_range);
    else if (k == "bos_token_id") { if (it->is_number_integer()) c.bos_token_id = it->get<int64_t>(); }
    else if (k == "eos_token_id") { if (it->is_number_integer()) c.eos_token_id = it->get<int64_t>(); }
    else if (k == "tie_word_embeddings") {
      if (!it->is_boolean()) fail(where, ": 'tie_word_embeddings' must be true or false");
      c.tie_word_embeddings = it->get<bool>();
    } else if (k == "hidden_act") {
      if (*it != "silu") fail(where, ": hidden_act ", it->dump(), " is not supported; Llama uses \"silu\"");
    } else if (k == "rope_scaling") {
      if (!it->is_null()) fail(where, ": rope_scaling ", it->dump(), " is not supported; only plain RoPE (null)");
    } else if (k == "attention_bias") {
      if (*it != false) fail(where, ": attention_bias=true is not supported; Llama has no biases");
    } else if (k == "head_dim") {
      // checked below, once hidden_size and num_attention_heads are known
    } else if (strict) {
      fail(where, ": unknown model field '", k, "'. Valid fields: preset, ", join(valid));
    }  // else: a Hub config.json key that does not change the math (architectures, torch_dtype, ...)
  }
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() != c.head_dim())
    fail(where, ": head_dim ", j["head_dim"].get<int64_t>(), " differs from hidden_size/num_attention_heads = ",
         c.head_dim(), "; such models are not supported");
}

LlamaConfig read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open model config '", path, "'");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail("model config '", path, "' is not valid JSON: ", e.what());
  }
  if (j.contains("model_type") && j["model_type"] != "llama")
    fail("model config '", path, "': model_type is ", j["model_type"].dump(), ", only \"llama\" is supported");
  if (!j.is_object()) fail("model config '", path, "' must be a JSON object, got a JSON ", j.type_name());
  // The shape has no sensible default: a config.json without it must not become Llama-7B silently.
  std::vector<std::string> missing;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    if (!j.contains(k)) missing.push_back(k);
  if (!missing.empty())
    fail("model config '", path, "' lacks ", join(missing),
         "; a Llama config.json must give the model's shape (write one with `shardlm export`, or copy the model's "
         "config.json from the Hub)");
  // Fields HF's LlamaConfig defaults when absent, with HF's defaults (they differ from our presets').
  if (!j.contains("rms_norm_eps")) j["rms_norm_eps"] = 1e-6;
  if (!j.contains("max_position_embeddings")) j["max_position_embeddings"] = 2048;
  // HF config.json omits num_key_value_heads for multi-head attention.
  LlamaConfig c;
  if (!j.contains("num_key_value_heads") && j.contains("num_attention_heads"))
    j["num_key_value_heads"] = j["num_attention_heads"];
  apply_hf_fields(c, j, /*strict=*/false, path);
  c.validate();
  return c;
}

nlohmann::json to_hf_json(const LlamaConfig& c) {
  return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"rope_theta", c.rope_theta},
                        {"rope_scaling", nullptr},
                        {"tie_word_embeddings", c.tie_word_embeddings},
                        {"hidden_act", "silu"},
                        {"attention_bias", false},
                        {"initializer_range", c.initializer_range},
                        {"bos_token_id", c.bos_token_id},
                        {"eos_token_id", c.eos_token_id},
                        {"torch_dtype", "float32"}};
}

void write_hf_config(const std::string& path, const LlamaConfig& c) {
  std::ofstream out(path);
  if (!out) fail("cannot write '", path, "'");
  out << to_hf_json(c).dump(2) << "\n";
}

}  // namespace shardlm::model
