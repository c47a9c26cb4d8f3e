// HF config.json <-> LlamaConfig, as transformers (5.x, and the 4.x files still on the Hub) reads it:
// the family's class defaults for absent keys (configuration_{llama,mistral,qwen2}.py), RoPE
// standardised as modeling_rope_utils.py's convert_rope_params_to_dict / standardize_rope_params
// do, every key under the rule of hf_config_keys.h. Presets and validation.
#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/hf_config_keys.h"
#include "model/hf_transformers_reads.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool is_rope_type(const std::string& t) {
  for (const char* k : {"default", "linear", "dynamic", "yarn", "longrope", "llama3"})
    if (t == k) return true;
  return false;
}
bool uses_original_length(const std::string& t) { return t == "yarn" || t == "longrope" || t == "llama3"; }

// The keys of a rope_parameters / rope_scaling dict each type reads (transformers' _validate_*
// functions: required and optional keys). Anything else in the dict is refused, since transformers
// would ignore it with only a warning.
const std::map<std::string, std::set<std::string>>& rope_keys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor"}},
      {"yarn", {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
                "mscale_all_dim", "truncate"}},
      {"longrope", {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor"}},
      {"llama3", {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}},
  };
  return keys;
}

// One RoPE dict (rope_parameters, or 4.x's rope_scaling with `type` as the old name of rope_type).
RopeParameters parse_rope_dict(const json& d, const std::string& key, double fallback_theta, const std::string& where) {
  if (!d.is_object()) fail(where, ": ", key, " must be a JSON object or null, got ", d.dump());
  RopeParameters r;
  if (d.contains("rope_type") && !d["rope_type"].is_null()) {
    if (!d["rope_type"].is_string()) fail(where, ": ", key, ".rope_type must be a string, got ", d["rope_type"].dump());
    r.type = d["rope_type"].get<std::string>();
  } else if (d.contains("type") && !d["type"].is_null()) {
    if (!d["type"].is_string()) fail(where, ": ", key, ".type must be a string, got ", d["type"].dump());
    r.type = d["type"].get<std::string>();
  }
  if (!is_rope_type(r.type))
    fail(where, ": ", key, " has rope type \"", r.type,
         "\", which shardlm does not implement; supported: default, linear, dynamic, yarn, longrope, llama3");
  r.theta = fallback_theta;
  const auto& allowed = rope_keys().at(r.type);
  auto num = [&](const std::string& k) {
    if (!d[k].is_number()) fail(where, ": ", key, ".", k, " must be a number, got ", d[k].dump());
    return d[k].get<double>();
  };
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string& k = it.key();
    if (k == "rope_type" || k == "type") continue;
    if (k == "truncate" && it->is_null()) {  // transformers reads it with get("truncate", True): null is false
      r.truncate = false;
      continue;
    }
    if (it->is_null()) continue;  // transformers treats an explicit null as absent
    if (k == "rope_theta") {
      r.theta = num(k);
    } else if (k == "partial_rotary_factor") {
      if (num(k) != 1.0)
        fail(where, ": ", key, ".partial_rotary_factor ", it->dump(),
             ": partial rotary embeddings are not supported (only 1.0)");
    } else if (!allowed.count(k)) {
      fail(where, ": ", key, ".", k, " = ", it->dump(), " is not a parameter of rope type \"", r.type,
           "\" (transformers would ignore it with a warning); remove it, or fix the rope type. \"", r.type,
           "\" reads: ", allowed.empty() ? std::string("rope_theta only") : join({allowed.begin(), allowed.end()}));
    } else if (k == "original_max_position_embeddings") {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0)
        fail(where, ": ", key, ".original_max_position_embeddings must be a positive integer, got ", it->dump());
      r.original_max_position_embeddings = it->get<int64_t>();
    } else if (k == "truncate") {
      if (!it->is_boolean()) fail(where, ": ", key, ".truncate must be true or false, got ", it->dump());
      r.truncate = it->get<bool>();
    } else if (k == "short_factor" || k == "long_factor") {
      if (!it->is_array()) fail(where, ": ", key, ".", k, " must be a list of numbers, got ", it->dump());
      auto& dst = k == "short_factor" ? r.short_factor : r.long_factor;
      for (const auto& x : *it) {
        if (!x.is_number()) fail(where, ": ", key, ".", k, " must be a list of numbers, got ", it->dump());
        dst.push_back(x.get<double>());
      }
    } else {
      const double v = num(k);
      if (k == "factor") r.factor = v;
      else if (k == "attention_factor") r.attention_factor = v;
      else if (k == "beta_fast") r.beta_fast = v;
      else if (k == "beta_slow") r.beta_slow = v;
      else if (k == "mscale") r.mscale = v;
      else if (k == "mscale_all_dim") r.mscale_all_dim = v;
      else if (k == "low_freq_factor") r.low_freq_factor = v;
      else if (k == "high_freq_factor") r.high_freq_factor = v;
    }
  }
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail(where, ": rope type \"", r.type, "\" needs ", what, " in ", key);
  };
  if (r.type == "linear" || r.type == "dynamic" || r.type == "yarn" || r.type == "llama3") need(r.factor.has_value(), "factor");
  if (r.type == "llama3") need(r.low_freq_factor && r.high_freq_factor, "low_freq_factor and high_freq_factor");
  if (r.type == "longrope") need(!r.short_factor.empty() && !r.long_factor.empty(), "short_factor and long_factor");
  return r;
}

json rope_dict(const RopeParameters& r, bool with_theta) {
  json d = {{"rope_type", r.type}};
  if (with_theta) d["rope_theta"] = r.theta;
  if (r.factor) d["factor"] = *r.factor;
  if (r.original_max_position_embeddings) d["original_max_position_embeddings"] = *r.original_max_position_embeddings;
  if (r.attention_factor) d["attention_factor"] = *r.attention_factor;
  if (r.beta_fast) d["beta_fast"] = *r.beta_fast;
  if (r.beta_slow) d["beta_slow"] = *r.beta_slow;
  if (r.mscale) d["mscale"] = *r.mscale;
  if (r.mscale_all_dim) d["mscale_all_dim"] = *r.mscale_all_dim;
  if (r.truncate) d["truncate"] = *r.truncate;
  if (!r.short_factor.empty()) d["short_factor"] = r.short_factor;
  if (!r.long_factor.empty()) d["long_factor"] = r.long_factor;
  if (r.low_freq_factor) d["low_freq_factor"] = *r.low_freq_factor;
  if (r.high_freq_factor) d["high_freq_factor"] = *r.high_freq_factor;
  return d;
}

std::optional<int64_t> optional_id(const json& v, const std::string& k, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) fail(where, ": '", k, "' must be an integer or null, got ", v.dump());
  return v.get<int64_t>();
}

// The class defaults of each family's config (transformers 5.x), for the keys a config.json may omit.
LlamaConfig family_defaults(const std::string& model_type) {
  LlamaConfig c;
  c.model_type = model_type;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 2048;
  if (model_type == "mistral") {
    c.max_position_embeddings = 4096 * 32;
    c.sliding_window = 4096;
    c.num_key_value_heads = 8;
  } else if (model_type == "qwen2") {
    c.max_position_embeddings = 32768;
    c.sliding_window = 4096;
    c.num_key_value_heads = 32;
    c.bos_token_id.reset();
    c.eos_token_ids.clear();
  } else if (model_type == "mixtral") {  // configuration_mixtral.py
    c.max_position_embeddings = 4096 * 32;
    c.rms_norm_eps = 1e-5;
    c.num_key_value_heads = 8;
    c.rope.theta = 1e6;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.norm_topk_prob = true;
  } else if (model_type == "qwen3" || model_type == "qwen3_moe") {  // configuration_qwen3{,_moe}.py
    c.max_position_embeddings = 32768;
    c.num_key_value_heads = model_type == "qwen3" ? 32 : 4;
    c.head_dim_value = model_type == "qwen3" ? 128 : 0;
    c.sliding_window.reset();
    c.bos_token_id.reset();
    c.eos_token_ids.clear();
    if (model_type == "qwen3_moe") {
      c.num_experts = 128;
      c.num_experts_per_tok = 8;
      c.norm_topk_prob = false;
      c.moe_intermediate_size = 768;
    }
  } else if (model_type == "qwen2_moe") {  // configuration_qwen2_moe.py
    c.max_position_embeddings = 32768;
    c.num_key_value_heads = 16;
    c.bos_token_id.reset();
    c.eos_token_ids.clear();
    c.num_experts = 60;
    c.num_experts_per_tok = 4;
    c.norm_topk_prob = false;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 5632;
  }
  return c;
}

std::string model_type_of(const json& j, const std::string& where) {
  if (!j.contains("model_type")) return "llama";
  const auto& t = j["model_type"];
  const auto& types = hf_model_types();
  if (!t.is_string() || std::find(types.begin(), types.end(), t.get<std::string>()) == types.end())
    fail(where, ": model_type is ", t.dump(), "; shardlm reads the families ", join(types),
         " (Llama with small changes); this model is not one of them");
  return t.get<std::string>();
}

}  // namespace

bool RopeParameters::operator==(const RopeParameters& o) const { return rope_dict(*this, true) == rope_dict(o, true); }

bool LlamaConfig::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (model_type == "mixtral") return true;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() &&
         (layer + 1) % decoder_sparse_step == 0;
}

int64_t LlamaConfig::window_of_layer(int64_t layer) const {
  if (model_type == "mistral" || model_type == "mixtral") return sliding_window.value_or(0);
  if (model_type != "qwen2" || !use_sliding_window || !sliding_window) return 0;
  const bool sliding = layer_types.empty() ? layer >= max_window_layers
                                           : layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  return sliding ? *sliding_window : 0;
}

std::string LlamaConfig::architecture() const {
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "mixtral") return "MixtralForCausalLM";
  if (model_type == "qwen2_moe") return "Qwen2MoeForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "LlamaForCausalLM";
}

void LlamaConfig::validate() const {
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_hidden_layers <= 0 ||
      num_attention_heads <= 0 || num_key_value_heads <= 0 || max_position_embeddings <= 0 || head_dim_value < 0)
    fail("model config: sizes must be positive (vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
         "num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings)");
  // transformers' LlamaConfig refuses this even with head_dim given; the others only need it to derive head_dim.
  if ((head_dim_value == 0 || model_type == "llama") && hidden_size % num_attention_heads != 0)
    fail("model config: hidden_size ", hidden_size, " is not divisible by num_attention_heads ", num_attention_heads);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("model config: num_attention_heads ", num_attention_heads, " is not a multiple of num_key_value_heads ",
         num_key_value_heads, " (grouped-query attention shares each key/value head among a whole group)");
  if (head_dim() % 2 != 0) fail("model config: head_dim ", head_dim(), " must be even for rotary embeddings");
  if (rms_norm_eps <= 0 || rope.theta <= 0) fail("model config: rms_norm_eps and rope_theta must be positive");
  if (rope.factor && *rope.factor <= 0) fail("model config: the rope factor must be positive, got ", *rope.factor);
  if (rope.type == "longrope") {
    const size_t half = static_cast<size_t>(head_dim() / 2);
    if (rope.short_factor.size() != half || rope.long_factor.size() != half)
      fail("model config: longrope's short_factor and long_factor need head_dim/2 = ", half, " values each, got ",
           rope.short_factor.size(), " and ", rope.long_factor.size());
  }
  if (sliding_window && *sliding_window <= 0)
    fail("model config: sliding_window must be a positive number of positions or null, got ", *sliding_window);
  if (!layer_types.empty() && static_cast<int64_t>(layer_types.size()) != num_hidden_layers)
    fail("model config: layer_types has ", layer_types.size(), " entries for ", num_hidden_layers, " layers");
  if (num_experts < 0) fail("model config: num_experts must be >= 0, got ", num_experts);
  if (is_moe()) {
    const char* count_key = model_type == "mixtral" ? "num_local_experts" : "num_experts";
    if (num_experts_per_tok <= 0)
      fail("model config: num_experts_per_tok must be positive, got ", num_experts_per_tok);
    if (num_experts_per_tok > num_experts)
      fail("model config: num_experts_per_tok (top-k) = ", num_experts_per_tok, " exceeds ", count_key, " = ",
           num_experts, ": a token cannot be routed to more experts than exist; set num_experts_per_tok <= ",
           num_experts);
    if (expert_intermediate_size() <= 0)
      fail("model config: the experts' width (", model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size",
           ") must be positive");
    if (model_type == "qwen2_moe" && shared_expert_intermediate_size <= 0)
      fail("model config: shared_expert_intermediate_size must be positive for qwen2_moe (transformers always builds "
           "the shared expert), got ", shared_expert_intermediate_size);
    if (model_type != "qwen2_moe" && shared_expert_intermediate_size != 0)
      fail("model config: ", model_type, " has no shared expert (shared_expert_intermediate_size must be 0)");
    if (decoder_sparse_step <= 0)
      fail("model config: decoder_sparse_step must be positive (transformers takes (i + 1) % step), got ",
           decoder_sparse_step);
    for (auto l : mlp_only_layers)
      if (l < 0 || l >= num_hidden_layers)
        fail("model config: mlp_only_layers names layer ", l, ", outside 0..", num_hidden_layers - 1);
    if (moe_capacity_factor < 0)
      fail("model config: moe_capacity_factor must be 0 (dropless) or positive, got ", moe_capacity_factor);
    if (router_aux_loss_coef < 0)
      fail("model config: router_aux_loss_coef must be >= 0, got ", router_aux_loss_coef);
  } else if (model_type == "mixtral" || model_type == "qwen2_moe" || model_type == "qwen3_moe") {
    // qwen2_moe / qwen3_moe with num_experts 0 are dense in transformers too; mixtral has no dense form.
    if (model_type == "mixtral") fail("model config: num_local_experts must be positive for mixtral");
  }
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

void apply_hf_fields(LlamaConfig& c, const json& j, const std::string& where, UnreadKeys keys_transformers_ignores) {
  if (!j.is_object()) fail(where, ": expected a JSON object of model fields");
  if (j.contains("model_type")) c.model_type = model_type_of(j, where);
  auto get_int = [&](const std::string& k, int64_t& dst) {
    if (!j[k].is_number_integer()) fail(where, ": '", k, "' must be an integer, got ", j[k].dump());
    dst = j[k].get<int64_t>();
  };
  auto get_num = [&](const std::string& k, double& dst) {
    if (!j[k].is_number()) fail(where, ": '", k, "' must be a number, got ", j[k].dump());
    dst = j[k].get<double>();
  };
  auto get_bool = [&](const std::string& k, bool& dst) {
    if (!j[k].is_boolean()) fail(where, ": '", k, "' must be true or false, got ", j[k].dump());
    dst = j[k].get<bool>();
  };
  auto only_false = [&](const std::string& k, const char* what) {
    if (!j[k].is_null() && j[k] != false) fail(where, ": ", k, " = ", j[k].dump(), ": ", what, " is not supported");
  };
  // RoPE keys are combined once all are seen (their precedence is transformers', not the file's order).
  const json* rope_scaling = nullptr;
  const json* rope_parameters = nullptr;
  std::optional<double> rope_theta;
  std::optional<int64_t> top_original;
  std::vector<std::string> unread;  // keys transformers does not read either: accepted, named once
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const HfConfigKey* entry = find_hf_config_key(k, c.model_type);
    if (!entry && keys_transformers_ignores == UnreadKeys::Accept && !transformers_reads(c.model_type, k)) {
      unread.push_back(k);
      continue;
    }
    if (!entry) {
      std::vector<std::string> honoured;
      for (const auto& e : hf_config_keys())
        if (e.use == KeyUse::Honoured && find_hf_config_key(e.key, c.model_type) == &e) honoured.push_back(e.key);
      fail(where, ": unknown model field '", k, "' = ", it->dump().substr(0, 80), ": not a ", c.model_type,
           " config.json key shardlm knows, and it refuses keys it does not understand rather than ignore them. "
           "Remove it if it does not change the model. Honoured keys: ", join(honoured),
           "; the math-neutral ones are listed by `shardlm plan --hf-keys`");
    }
    if (entry->use == KeyUse::Neutral) continue;
    if (k == "model_type") continue;
    else if (k == "vocab_size") get_int(k, c.vocab_size);
    else if (k == "hidden_size") get_int(k, c.hidden_size);
    else if (k == "intermediate_size") get_int(k, c.intermediate_size);
    else if (k == "num_hidden_layers") get_int(k, c.num_hidden_layers);
    else if (k == "num_attention_heads") get_int(k, c.num_attention_heads);
    else if (k == "num_key_value_heads") { if (!it->is_null()) get_int(k, c.num_key_value_heads); }
    else if (k == "head_dim") { if (!it->is_null()) get_int(k, c.head_dim_value); }
    else if (k == "max_position_embeddings") get_int(k, c.max_position_embeddings);
    else if (k == "rms_norm_eps") get_num(k, c.rms_norm_eps);
    else if (k == "initializer_range") get_num(k, c.initializer_range);
    else if (k == "tie_word_embeddings") get_bool(k, c.tie_word_embeddings);
    else if (k == "attention_bias") get_bool(k, c.attention_bias);
    else if (k == "mlp_bias") get_bool(k, c.mlp_bias);
    else if (k == "use_sliding_window") get_bool(k, c.use_sliding_window);
    else if (k == "max_window_layers") get_int(k, c.max_window_layers);
    else if (k == "num_local_experts" || k == "num_experts") get_int(k, c.num_experts);
    else if (k == "num_experts_per_tok") get_int(k, c.num_experts_per_tok);
    else if (k == "norm_topk_prob") get_bool(k, c.norm_topk_prob);
    else if (k == "moe_intermediate_size") get_int(k, c.moe_intermediate_size);
    else if (k == "shared_expert_intermediate_size") get_int(k, c.shared_expert_intermediate_size);
    else if (k == "decoder_sparse_step") get_int(k, c.decoder_sparse_step);
    else if (k == "router_aux_loss_coef") get_num(k, c.router_aux_loss_coef);
    else if (k == "output_router_logits") get_bool(k, c.output_router_logits);
    else if (k == "moe_capacity_factor") get_num(k, c.moe_capacity_factor);
    else if (k == "qkv_bias") get_bool(k, c.qkv_bias);
    else if (k == "mlp_only_layers") {
      c.mlp_only_layers.clear();
      if (!it->is_null()) {
        if (!it->is_array()) fail(where, ": mlp_only_layers must be a list of layer indices, got ", it->dump());
        for (const auto& x : *it) {
          if (!x.is_number_integer()) fail(where, ": mlp_only_layers entries must be integers, got ", it->dump());
          c.mlp_only_layers.push_back(x.get<int64_t>());
        }
      }
    } else if (k == "router_jitter_noise") {
      if (!it->is_number() || it->get<double>() != 0.0)
        fail(where, ": router_jitter_noise ", it->dump(), " is not supported: transformers multiplies the router's "
             "input by uniform noise in training, which shardlm does not implement; set it to 0.0");
    }
    else if (k == "rope_theta") { double v = 0; get_num(k, v); rope_theta = v; }
    else if (k == "rope_scaling") rope_scaling = &*it;
    else if (k == "rope_parameters") rope_parameters = &*it;
    else if (k == "original_max_position_embeddings") { int64_t v = 0; get_int(k, v); top_original = v; }
    else if (k == "partial_rotary_factor") {
      if (!it->is_null() && (!it->is_number() || it->get<double>() != 1.0))
        fail(where, ": partial_rotary_factor ", it->dump(), ": partial rotary embeddings are not supported (only 1.0)");
    } else if (k == "hidden_act") {
      if (*it != "silu" && *it != "swish")
        fail(where, ": hidden_act ", it->dump(), " is not supported; the Llama family's MLP uses \"silu\"");
    } else if (k == "attention_dropout") {
      if (!it->is_number() || it->get<double>() != 0.0)
        fail(where, ": attention_dropout ", it->dump(), " is not supported (attention dropout is not implemented); "
             "set it to 0.0");
    } else if (k == "sliding_window") {
      if (it->is_null()) c.sliding_window.reset();
      else { int64_t v = 0; get_int(k, v); c.sliding_window = v; }
      if ((c.model_type == "qwen2_moe" || c.model_type == "qwen3" || c.model_type == "qwen3_moe") && c.sliding_window &&
          *c.sliding_window == 0)
        c.sliding_window.reset();
      if (c.model_type == "llama" && c.sliding_window)
        fail(where, ": sliding_window ", it->dump(), " in a llama config: transformers' LlamaForCausalLM ignores it, "
             "so the model would not be the windowed one you may expect. Use model_type \"mistral\" for a windowed "
             "model, or set it to null");
    } else if (k == "layer_types") {
      c.layer_types.clear();
      if (!it->is_null()) {
        if (!it->is_array()) fail(where, ": layer_types must be a list, got ", it->dump());
        for (const auto& t : *it) {
          if (t != "full_attention" && t != "sliding_attention")
            fail(where, ": layer_types entry ", t.dump(), " is not \"full_attention\" or \"sliding_attention\"");
          c.layer_types.push_back(t.get<std::string>());
        }
      }
    } else if (k == "bos_token_id") c.bos_token_id = optional_id(*it, k, where);
    else if (k == "pad_token_id") c.pad_token_id = optional_id(*it, k, where);
    else if (k == "eos_token_id") {
      c.eos_token_ids.clear();
      c.eos_is_list = it->is_array();
      if (it->is_array()) {
        for (const auto& x : *it) {
          if (!x.is_number_integer()) fail(where, ": eos_token_id entries must be integers, got ", it->dump());
          c.eos_token_ids.push_back(x.get<int64_t>());
        }
      } else if (auto id = optional_id(*it, k, where)) {
        c.eos_token_ids.push_back(*id);
      }
    } else if (k == "architectures") {
      // transformers picks the class from model_type; the name matters only when it asks for
      // another head (a classifier, the bare model), whose weights would not be a causal LM's.
      if (!it->is_null()) {
        if (!it->is_array()) fail(where, ": architectures must be a list, got ", it->dump());
        for (const auto& a : *it) {
          const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
          const std::string suffix = "ForCausalLM";
          if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            fail(where, ": architectures names \"", name, "\"; shardlm trains causal LMs (", c.architecture(),
                 "); other heads are not supported");
        }
      }
    } else if (k == "is_encoder_decoder") only_false(k, "an encoder-decoder model");
    else if (k == "add_cross_attention") only_false(k, "cross-attention");
    else if (k == "use_mrope") only_false(k, "multimodal RoPE (use_mrope)");
    else if (k == "pruned_heads") {
      if (!it->is_null() && !it->empty()) fail(where, ": pruned_heads ", it->dump(), ": pruned heads are not supported");
    } else if (k == "auto_map") {
      // transformers too builds its own class for a model_type it has, unless told to trust remote code.
      c.notices.push_back("auto_map " + it->dump().substr(0, 120) + ": accepted; no custom code runs (shardlm builds " +
                          c.model_type + "'s own architecture, as transformers does without trust_remote_code)");
    } else if (k == "quantization_config") {
      fail(where, ": quantization_config: quantized checkpoints are not supported; give the unquantized weights");
    } else {
      fail("internal: config.json key '", k, "' is marked honoured in model/hf_config_keys.cpp but not read");
    }
  }
  if (!unread.empty())
    c.notices.push_back("ignored " + std::string(unread.size() == 1 ? "key " : "keys ") + join(unread) +
                        ": transformers " + transformers_pin() + " does not read " +
                        (unread.size() == 1 ? "it" : "them") + " for model_type " + c.model_type +
                        " (not a config field, not read by its modelling code), so " +
                        (unread.size() == 1 ? "it changes" : "they change") + " nothing");
  // transformers: a non-empty rope_scaling replaces rope_parameters; the dict's rope_theta wins over
  // the top-level one; a top-level original_max_position_embeddings replaces the dict's (for the types
  // that read it), which otherwise defaults to max_position_embeddings.
  const json* dict = rope_scaling && !rope_scaling->is_null() && !rope_scaling->empty() ? rope_scaling
                     : rope_parameters && !rope_parameters->is_null()                    ? rope_parameters
                                                                                         : nullptr;
  const double theta = rope_theta.value_or(c.rope.theta);
  if (dict) c.rope = parse_rope_dict(*dict, dict == rope_scaling ? "rope_scaling" : "rope_parameters", theta, where);
  else if (rope_theta) c.rope.theta = *rope_theta;
  if (top_original) {
    if (!uses_original_length(c.rope.type))
      fail(where, ": original_max_position_embeddings = ", *top_original, " is not read by rope type \"", c.rope.type,
           "\" (only yarn, longrope and llama3 read it); remove it");
    c.rope.original_max_position_embeddings = top_original;
  }
  if (uses_original_length(c.rope.type) && !c.rope.original_max_position_embeddings)
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
  if (c.model_type == "qwen2_moe" || c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    if (c.use_sliding_window)
      fail(where, ": use_sliding_window true in a ", c.model_type, " config: this family's sliding-window layers are "
           "not implemented; set it to false");
    for (const auto& t : c.layer_types)
      if (t != "full_attention")
        fail(where, ": layer_types has \"", t, "\" in a ", c.model_type, " config; only full_attention layers are "
             "supported");
    c.sliding_window.reset();  // transformers ignores it without use_sliding_window
  }
  if (c.model_type == "qwen2" && !c.layer_types.empty() && !c.use_sliding_window &&
      std::count(c.layer_types.begin(), c.layer_types.end(), "sliding_attention") > 0)
    fail(where, ": layer_types has sliding_attention layers but use_sliding_window is false (transformers then has "
         "no window to apply); set use_sliding_window to true or make every layer full_attention");
}

LlamaConfig hf_config_from_json(const json& j_in, const std::string& where) {
  if (!j_in.is_object()) fail("model config '", where, "' must be a JSON object, got a JSON ", j_in.type_name());
  LlamaConfig c = family_defaults(model_type_of(j_in, where));
  // The shape has no sensible default: a config.json without it must not become Llama-7B silently.
  std::vector<std::string> missing;
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    if (!j_in.contains(k)) missing.push_back(k);
  if (!missing.empty())
    fail("model config '", where, "' lacks ", join(missing),
         "; a config.json must give the model's shape (write one with `shardlm export`, or copy the model's "
         "config.json from the Hub)");
  json j = j_in;
  // transformers: num_key_value_heads None (llama: also absent) means one KV head per query head.
  if ((!j.contains("num_key_value_heads") && c.model_type == "llama") ||
      (j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null()))
    j["num_key_value_heads"] = j["num_attention_heads"];
  apply_hf_fields(c, j, where, UnreadKeys::Accept);
  c.validate();
  return c;
}

LlamaConfig read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open model config '", path, "'");
  json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail("model config '", path, "' is not valid JSON: ", e.what());
  }
  return hf_config_from_json(j, path);
}

json to_hf_json(const LlamaConfig& c) {
  auto id = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  json eos = c.eos_is_list ? json(c.eos_token_ids) : c.eos_token_ids.empty() ? json(nullptr) : json(c.eos_token_ids[0]);
  json j = {{"architectures", {c.architecture()}},
            {"model_type", c.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim()},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope.theta},
            {"rope_scaling", c.rope.type == "default" ? json(nullptr) : rope_dict(c.rope, false)},
            {"rope_parameters", rope_dict(c.rope, true)},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"hidden_act", "silu"},
            {"attention_dropout", 0.0},
            {"initializer_range", c.initializer_range},
            {"bos_token_id", id(c.bos_token_id)},
            {"eos_token_id", eos},
            {"pad_token_id", id(c.pad_token_id)},
            {"torch_dtype", "float32"}};
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  if (c.model_type != "llama") j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  if (c.model_type == "mixtral") {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    j["router_jitter_noise"] = 0.0;
  }
  if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    j["attention_bias"] = c.attention_bias;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.max_window_layers;
  }
  if (c.model_type == "qwen3_moe") {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
  }
  if (c.model_type == "qwen2_moe") {
    j["qkv_bias"] = c.qkv_bias;
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.max_window_layers;
  }
  if (c.model_type == "qwen2") {
    j["use_sliding_window"] = c.use_sliding_window;
    j["max_window_layers"] = c.max_window_layers;
    if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
  }
  return j;
}

void write_hf_config(const std::string& path, const LlamaConfig& c) {
  std::ofstream out(path);
  if (!out) fail("cannot write '", path, "'");
  out << to_hf_json(c).dump(2) << "\n";
}

}  // namespace shardlm::model
