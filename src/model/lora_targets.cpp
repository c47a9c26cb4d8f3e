// Which linears LoRA adapts, with which rank and alpha: PEFT's matching rules
// (peft/tuners/tuners_utils.py check_target_module_exists, peft/utils/other.py get_pattern_key,
// peft 0.22.0) applied to the module names transformers gives a Llama-family model
// ("model.layers.3.self_attn.q_proj").
#include <cmath>
#include <regex>
#include <set>

#include "model/family.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "util/error.h"

namespace shardlm::model {

std::vector<std::string> default_lora_targets(const std::string& model_type) {
  const auto& targets = family(model_type).peft_default_lora_targets;  // PEFT's mapping (model/family.h)
  if (!targets.empty()) return {targets.begin(), targets.end()};
  fail("lora.target_modules: PEFT has no default target modules for model_type \"", model_type,
       "\"; name them, e.g. \"target_modules\": [\"q_proj\", \"v_proj\"] or \"all-linear\"");
}

std::vector<std::string> layer_linear_modules(const LlamaConfig& cfg, int64_t layer) {
  std::vector<std::string> m = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
  if (!cfg.is_moe_layer(layer)) m.insert(m.end(), {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"});
  return m;
}

std::vector<std::string> layer_expert_parameters(const LlamaConfig& cfg, int64_t layer) {
  if (!cfg.is_moe_layer(layer)) return {};
  return {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
}

namespace {

std::string module_key(int64_t layer, const std::string& module) {
  return "model.layers." + std::to_string(layer) + "." + module;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// PEFT's list rule: the key equals the name or ends with "." + name.
bool name_matches(const std::string& key, const std::string& name) { return key == name || ends_with(key, "." + name); }

// get_pattern_key: the first pattern p with re.match(rf"(.*\.)?({p})$", key).
template <typename T>
const T* pattern_value(const std::map<std::string, T>& patterns, const std::string& key, const char* what) {
  for (const auto& [p, v] : patterns) {
    try {
      if (std::regex_match(key, std::regex("(.*\\.)?(" + p + ")"))) return &v;
    } catch (const std::regex_error& e) {
      fail("lora.", what, ": \"", p, "\" is not a regular expression (", e.what(), ")");
    }
  }
  return nullptr;
}

std::vector<std::string> trained_in_full(const LoraOptions& o, const LlamaConfig& cfg) {
  std::vector<std::string> out;
  for (const auto& m : o.modules_to_save) {
    if (m == "lm_head" || m == "embed_tokens" || m == "model.embed_tokens") {
      if (cfg.tie_word_embeddings)
        fail("lora.modules_to_save: \"", m, "\" with tie_word_embeddings=true is not supported (the head and the "
             "embedding are one tensor); untie them or leave modules_to_save out");
      out.push_back(m == "lm_head" ? "lm_head.weight" : "model.embed_tokens.weight");
    } else {
      fail("lora.modules_to_save: \"", m, "\" is not supported; shardlm trains \"lm_head\" and \"embed_tokens\" in full");
    }
  }
  return out;
}

}  // namespace

namespace {

// The adapter of `module` in `layer` (full name `key`): r and alpha from rank_pattern / alpha_pattern
// where one matches, else the section's; scaling alpha / r, or alpha / sqrt(r) with use_rslora.
// A linear and an expert parameter alike.
LoraTarget adapter_target(const LoraOptions& o, int64_t layer, const std::string& module, const std::string& key) {
  LoraTarget t{layer, module, o.r, o.lora_alpha, 0};
  if (const auto* r = pattern_value(o.rank_pattern, key, "rank_pattern")) t.r = *r;
  if (const auto* a = pattern_value(o.alpha_pattern, key, "alpha_pattern")) t.alpha = *a;
  if (t.r <= 0) fail("lora.rank_pattern: rank ", t.r, " for ", key, " must be > 0");
  t.scaling = o.use_rslora ? t.alpha / std::sqrt(static_cast<double>(t.r)) : t.alpha / static_cast<double>(t.r);
  return t;
}

// PEFT's _inject_parameters for one layer: each expert weight whose name "model.layers.L.mlp.experts.X"
// equals a target_parameters entry or ends with "." + it (layers_to_transform does not apply), r and
// alpha from the patterns as for a module. Two on one module nest (the first registered innermost:
// its adapters live under "mlp.experts.base_layer").
void add_expert_targets(const LoraOptions& o, const LlamaConfig& cfg, int64_t layer, LoraPlan& plan,
                        std::set<std::string>& used) {
  if (o.target_parameters.empty()) return;
  if (o.lora_dropout > 0)
    fail("lora.target_parameters with lora.lora_dropout = ", o.lora_dropout, ": PEFT refuses dropout on a targeted ",
         "parameter (lora.ParamWrapper does not work with lora_dropout != 0: x cannot be factored out of the expert "
         "weight); set lora_dropout to 0");
  std::vector<LoraTarget> hits;
  for (const auto& m : layer_expert_parameters(cfg, layer)) {
    const auto key = module_key(layer, m);
    bool hit = false;
    for (const auto& n : o.target_parameters)
      if (name_matches(key, n)) used.insert(n), hit = true;
    if (!hit) continue;
    auto t = adapter_target(o, layer, m, key);
    t.experts = cfg.num_experts;
    hits.push_back(t);
  }
  for (size_t k = 0; k < hits.size(); ++k) {
    hits[k].adapter_module = "mlp.experts";
    for (size_t n = k + 1; n < hits.size(); ++n) hits[k].adapter_module += ".base_layer";
    plan.targets.push_back(hits[k]);
  }
}

}  // namespace

LoraPlan resolve_lora(const LoraOptions& o, const LlamaConfig& cfg) {
  if (o.r <= 0) fail("lora.r must be > 0, got ", o.r);
  if (!(o.lora_alpha > 0) && !(o.lora_alpha < 0)) fail("lora.lora_alpha must be nonzero, got ", o.lora_alpha);
  if (!(o.lora_dropout >= 0 && o.lora_dropout < 1)) fail("lora.lora_dropout must be in [0, 1), got ", o.lora_dropout);
  if (!o.target_regex.empty() && !o.target_modules.empty())
    fail("lora.target_modules: give a list of names or one regex string, not both (internal error)");
  const bool all_linear = o.target_regex == "all-linear" || o.target_regex == "ALL-LINEAR";
  if (all_linear && cfg.is_moe())
    fail("lora.target_modules: \"all-linear\" on the mixture-of-experts model_type \"", cfg.model_type,
         "\" is not supported (PEFT would adapt the router too, which shardlm does not); name the attention projections "
         "and adapt the experts through lora.target_parameters");
  std::vector<std::string> names = o.target_modules;
  // PEFT's default targets only when neither modules nor expert parameters are named (with
  // target_parameters alone, PEFT sets target_modules to an empty set).
  if (o.target_regex.empty() && names.empty() && o.target_parameters.empty())
    names = default_lora_targets(cfg.model_type);
  for (const auto& n : names)
    if (n == "lm_head" || n == "embed_tokens" || n == "model.embed_tokens")
      fail("lora.target_modules: adapting \"", n, "\" is not supported; train it in full with lora.modules_to_save");
  std::regex re;
  if (!o.target_regex.empty() && !all_linear) {
    try {
      re = std::regex(o.target_regex);
    } catch (const std::regex_error& e) {
      fail("lora.target_modules: \"", o.target_regex, "\" is not a regular expression (", e.what(), ")");
    }
  }
  for (auto l : o.layers_to_transform)
    if (l < 0 || l >= cfg.num_hidden_layers)
      fail("lora.layers_to_transform: layer ", l, " does not exist (the model has ", cfg.num_hidden_layers, " layers)");
  const std::set<int64_t> layers(o.layers_to_transform.begin(), o.layers_to_transform.end());
  LoraPlan plan;
  std::set<std::string> used, used_parameters;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    for (const auto& m : layer_linear_modules(cfg, i)) {
      const auto key = module_key(i, m);
      bool hit = false;
      if (all_linear) hit = true;
      else if (!o.target_regex.empty()) hit = std::regex_match(key, re);
      else
        for (const auto& n : names)
          if (name_matches(key, n)) used.insert(n), hit = true;
      // layers_to_transform applies to a list of names only (PEFT ignores it for a regex).
      if (!hit || (o.target_regex.empty() && !layers.empty() && !layers.count(i))) continue;
      plan.targets.push_back(adapter_target(o, i, m, key));
    }
    add_expert_targets(o, cfg, i, plan, used_parameters);
  }
  for (const auto& n : o.target_parameters)
    if (!used_parameters.count(n))
      fail("lora.target_parameters: \"", n, "\" matches no expert parameter of this ", cfg.model_type, " model",
           cfg.is_moe() ? " (its sparse layers have mlp.experts.gate_up_proj and mlp.experts.down_proj)"
                        : " (a dense model has no 3-D expert weights; adapt its linears with lora.target_modules)",
           "; PEFT's ParamWrapper is supported on the experts' 3-D weights only");
  for (const auto& n : names)
    if (o.target_regex.empty() && !used.count(n))
      fail("lora.target_modules: \"", n, "\" matches no linear module of this ", cfg.model_type,
           " model (its layers have q_proj, k_proj, v_proj, o_proj", cfg.is_moe() ? "" : ", gate_proj, up_proj, down_proj", ")");
  if (plan.targets.empty())
    fail("lora.target_modules: no linear module matches", o.target_regex.empty() ? "" : " \"" + o.target_regex + "\"",
         layers.empty() ? "" : " in lora.layers_to_transform", " (module names look like model.layers.0.self_attn.q_proj)");
  plan.trained_in_full = trained_in_full(o, cfg);
  plan.dropout = o.lora_dropout;
  plan.init = o.init_lora_weights;
  return plan;
}

}  // namespace shardlm::model
