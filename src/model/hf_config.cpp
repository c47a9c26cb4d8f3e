// config.json <-> LlamaConfig (declared in llama_config.h), as transformers (5.x, and the 4.x files
// still on the Hub) reads it: the family's class defaults for absent keys (configuration_*.py), every
// key under the rule of hf_config_keys.h (honoured keys read here, values shardlm does not implement
// refused), RoPE through hf_rope.h; and the config.json written back for transformers.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/family.h"
#include "model/hf_config_keys.h"
#include "model/hf_rope.h"
#include "model/hf_transformers_reads.h"
#include "model/llama_config.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::optional<int64_t> optional_id(const json& v, const std::string& k, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) fail(where, ": '", k, "' must be an integer or null, got ", v.dump());
  return v.get<int64_t>();
}

// A family's class defaults (transformers 5.x), for the keys a config.json may omit: what every
// class shares, then the family's own (its descriptor, model/family.h).
LlamaConfig family_defaults(const std::string& model_type) {
  LlamaConfig c;
  c.model_type = model_type;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 2048;
  family(model_type).defaults(c);
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
// The RoPE keys of one config.json, combined once all are seen: their precedence is transformers',
// not the file's order.
struct RopeKeys {
  const json* scaling = nullptr;
  const json* parameters = nullptr;
  std::optional<double> theta;
  std::optional<int64_t> top_original;
};

// Honoured key `k` = `value` read into `c` (the RoPE keys collected into `rope`); a value shardlm does
// not implement is refused, naming key, value and fix.
void read_honoured_key(LlamaConfig& c, const std::string& k, const json& value, const std::string& where,
                       RopeKeys& rope) {
  auto get_int = [&](const std::string& k, int64_t& dst) {
    if (!value.is_number_integer()) fail(where, ": '", k, "' must be an integer, got ", value.dump());
    dst = value.get<int64_t>();
  };
  auto get_num = [&](const std::string& k, double& dst) {
    if (!value.is_number()) fail(where, ": '", k, "' must be a number, got ", value.dump());
    dst = value.get<double>();
  };
  auto get_bool = [&](const std::string& k, bool& dst) {
    if (!value.is_boolean()) fail(where, ": '", k, "' must be true or false, got ", value.dump());
    dst = value.get<bool>();
  };
  auto only_false = [&](const std::string& k, const char* what) {
    if (!value.is_null() && value != false) fail(where, ": ", k, " = ", value.dump(), ": ", what, " is not supported");
  };
  if (k == "model_type") return;
  else if (k == "vocab_size") get_int(k, c.vocab_size);
  else if (k == "hidden_size") get_int(k, c.hidden_size);
  else if (k == "intermediate_size") get_int(k, c.intermediate_size);
  else if (k == "num_hidden_layers") get_int(k, c.num_hidden_layers);
  else if (k == "num_attention_heads") get_int(k, c.num_attention_heads);
  else if (k == "num_key_value_heads") { if (!value.is_null()) get_int(k, c.num_key_value_heads); }
  else if (k == "head_dim") { if (!value.is_null()) get_int(k, c.head_dim_value); }
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
    if (!value.is_null()) {
      if (!value.is_array()) fail(where, ": mlp_only_layers must be a list of layer indices, got ", value.dump());
      for (const auto& x : value) {
        if (!x.is_number_integer()) fail(where, ": mlp_only_layers entries must be integers, got ", value.dump());
        c.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
  } else if (k == "router_jitter_noise") {
    if (!value.is_number() || value.get<double>() != 0.0)
      fail(where, ": router_jitter_noise ", value.dump(), " is not supported: transformers multiplies the router's "
           "input by uniform noise in training, which shardlm does not implement; set it to 0.0");
  }
  else if (k == "rope_theta") { double v = 0; get_num(k, v); rope.theta = v; }
  else if (k == "rope_scaling") rope.scaling = &value;
  else if (k == "rope_parameters") rope.parameters = &value;
  else if (k == "original_max_position_embeddings") { int64_t v = 0; get_int(k, v); rope.top_original = v; }
  else if (k == "partial_rotary_factor") {
    if (!value.is_null() && (!value.is_number() || value.get<double>() != 1.0))
      fail(where, ": partial_rotary_factor ", value.dump(), ": partial rotary embeddings are not supported (only 1.0)");
  } else if (k == "hidden_act") {
    if (value != "silu" && value != "swish")
      fail(where, ": hidden_act ", value.dump(), " is not supported; the Llama family's MLP uses \"silu\"");
  } else if (k == "attention_dropout") {
    if (!value.is_number() || value.get<double>() != 0.0)
      fail(where, ": attention_dropout ", value.dump(), " is not supported (attention dropout is not implemented); "
           "set it to 0.0");
  } else if (k == "sliding_window") {
    if (value.is_null()) c.sliding_window.reset();
    else { int64_t v = 0; get_int(k, v); c.sliding_window = v; }
    const Windows windows = c.family().windows;
    if (windows == Windows::Off && c.sliding_window && *c.sliding_window == 0) c.sliding_window.reset();
    if (windows == Windows::Refused && c.sliding_window)
      fail(where, ": sliding_window ", value.dump(), " in a llama config: transformers' LlamaForCausalLM ignores it, "
           "so the model would not be the windowed one you may expect. Use model_type \"mistral\" for a windowed "
           "model, or set it to null");
  } else if (k == "layer_types") {
    c.layer_types.clear();
    if (!value.is_null()) {
      if (!value.is_array()) fail(where, ": layer_types must be a list, got ", value.dump());
      for (const auto& t : value) {
        if (t != "full_attention" && t != "sliding_attention")
          fail(where, ": layer_types entry ", t.dump(), " is not \"full_attention\" or \"sliding_attention\"");
        c.layer_types.push_back(t.get<std::string>());
      }
    }
  } else if (k == "bos_token_id") c.bos_token_id = optional_id(value, k, where);
  else if (k == "pad_token_id") c.pad_token_id = optional_id(value, k, where);
  else if (k == "eos_token_id") {
    c.eos_token_ids.clear();
    c.eos_is_list = value.is_array();
    if (value.is_array()) {
      for (const auto& x : value) {
        if (!x.is_number_integer()) fail(where, ": eos_token_id entries must be integers, got ", value.dump());
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else if (auto id = optional_id(value, k, where)) {
      c.eos_token_ids.push_back(*id);
    }
  } else if (k == "architectures") {
    // transformers picks the class from model_type; the name matters only when it asks for
    // another head (a classifier, the bare model), whose weights would not be a causal LM's.
    if (!value.is_null()) {
      if (!value.is_array()) fail(where, ": architectures must be a list, got ", value.dump());
      for (const auto& a : value) {
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
    if (!value.is_null() && !value.empty()) fail(where, ": pruned_heads ", value.dump(), ": pruned heads are not supported");
  } else if (k == "auto_map") {
    // transformers too builds its own class for a model_type it has, unless told to trust remote code.
    c.notices.push_back("auto_map " + value.dump().substr(0, 120) + ": accepted; no custom code runs (shardlm builds " +
                        c.model_type + "'s own architecture, as transformers does without trust_remote_code)");
  } else if (k == "quantization_config") {
    fail(where, ": quantization_config: quantized checkpoints are not supported; give the unquantized weights");
  } else {
    fail("internal: config.json key '", k, "' is marked honoured in model/hf_config_keys.cpp but not read");
  }
}

// The model's RoPE from the keys `rope` collected.
void resolve_rope(LlamaConfig& c, const RopeKeys& rope, const std::string& where) {
  // transformers: a non-empty rope_scaling replaces rope_parameters; the dict's rope_theta wins over
  // the top-level one; a top-level original_max_position_embeddings replaces the dict's (for the types
  // that read it), which otherwise defaults to max_position_embeddings.
  const json* dict = rope.scaling && !rope.scaling->is_null() && !rope.scaling->empty() ? rope.scaling
                     : rope.parameters && !rope.parameters->is_null()                    ? rope.parameters
                                                                                         : nullptr;
  const double theta = rope.theta.value_or(c.rope.theta);
  if (dict) c.rope = parse_rope_dict(*dict, dict == rope.scaling ? "rope_scaling" : "rope_parameters", theta, where);
  else if (rope.theta) c.rope.theta = *rope.theta;
  if (rope.top_original) {
    if (!uses_original_length(c.rope.type))
      fail(where, ": original_max_position_embeddings = ", *rope.top_original, " is not read by rope type \"", c.rope.type,
           "\" (only yarn, longrope and llama3 read it); remove it");
    c.rope.original_max_position_embeddings = rope.top_original;
  }
  if (uses_original_length(c.rope.type) && !c.rope.original_max_position_embeddings)
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
}

// What a family's config refuses once every key is read (windows it does not implement).
void check_family_windows(LlamaConfig& c, const std::string& where) {
  const Windows windows = c.family().windows;
  if (windows == Windows::Off) {
    if (c.use_sliding_window)
      fail(where, ": use_sliding_window true in a ", c.model_type, " config: this family's sliding-window layers are "
           "not implemented; set it to false");
    for (const auto& t : c.layer_types)
      if (t != "full_attention")
        fail(where, ": layer_types has \"", t, "\" in a ", c.model_type, " config; only full_attention layers are "
             "supported");
    c.sliding_window.reset();  // transformers ignores it without use_sliding_window
  }
  if (windows == Windows::PerLayer && !c.layer_types.empty() && !c.use_sliding_window &&
      std::count(c.layer_types.begin(), c.layer_types.end(), "sliding_attention") > 0)
    fail(where, ": layer_types has sliding_attention layers but use_sliding_window is false (transformers then has "
         "no window to apply); set use_sliding_window to true or make every layer full_attention");
}

}  // namespace

void apply_hf_fields(LlamaConfig& c, const json& j, const std::string& where, UnreadKeys keys_transformers_ignores) {
  if (!j.is_object()) fail(where, ": expected a JSON object of model fields");
  if (j.contains("model_type")) c.model_type = model_type_of(j, where);
  RopeKeys rope;
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
    read_honoured_key(c, k, *it, where, rope);
  }
  if (!unread.empty())
    c.notices.push_back("ignored " + std::string(unread.size() == 1 ? "key " : "keys ") + join(unread) +
                        ": transformers " + transformers_pin() + " does not read " +
                        (unread.size() == 1 ? "it" : "them") + " for model_type " + c.model_type +
                        " (not a config field, not read by its modelling code), so " +
                        (unread.size() == 1 ? "it changes" : "they change") + " nothing");
  resolve_rope(c, rope, where);
  check_family_windows(c, where);
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
  if ((!j.contains("num_key_value_heads") && c.family().kv_heads_default_to_heads) ||
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
  // Every windowed family writes its window (null: none); then the keys of the family's own class.
  if (c.family().windows != Windows::Refused)
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  c.family().export_keys(c, j);
  return j;
}

void write_hf_config(const std::string& path, const LlamaConfig& c) {
  std::ofstream out(path);
  if (!out) fail("cannot write '", path, "'");
  out << to_hf_json(c).dump(2) << "\n";
}

}  // namespace shardlm::model
