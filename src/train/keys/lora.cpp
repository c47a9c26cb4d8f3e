// The lora section: PEFT LoraConfig's keys with PEFT's meanings (model/lora.h; docs/lora.md), plus
// shardlm's switch, PEFT's own adapter_config.json and the adapter to start from.
#include "train/keys/sections.h"

#include "train/keys/rows.h"

namespace shardlm::train::keys {
namespace {

bool lora_on(const TrainConfig& c) { return c.lora.enabled; }

std::string targets_problem(const json& v) {
  if (v.is_null() || v.is_string()) return "";
  return json_type_problem<std::vector<std::string>>(v).empty() ? "" : "must be a list of module names or one regex string";
}
void set_targets(TrainConfig& c, const json& v) {
  c.lora.peft.target_modules.clear();
  c.lora.peft.target_regex.clear();
  if (v.is_string()) c.lora.peft.target_regex = v.get<std::string>();
  else if (v.is_array()) c.lora.peft.target_modules = v.get<std::vector<std::string>>();
}
json get_targets(const TrainConfig& c) {
  if (!c.lora.peft.target_regex.empty()) return c.lora.peft.target_regex;
  if (!c.lora.peft.target_modules.empty()) return c.lora.peft.target_modules;
  return nullptr;
}

std::string init_problem(const json& v) {
  return v.is_boolean() || (v.is_string() && v.get<std::string>() == "gaussian")
             ? ""
             : "must be true, false or \"gaussian\" (PEFT's pissa, olora, loftq, eva, corda are not implemented)";
}
void set_init(TrainConfig& c, const json& v) {
  c.lora.peft.init_lora_weights = v.is_boolean() ? (v.get<bool>() ? "true" : "false") : v.get<std::string>();
}
json get_init(const TrainConfig& c) {
  const auto& s = c.lora.peft.init_lora_weights;
  return s == "true" ? json(true) : s == "false" ? json(false) : json(s);
}

std::string layers_problem(const json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer()) return "";
  return json_type_problem<std::vector<int64_t>>(v).empty() ? "" : "must be a layer index or a list of them";
}
void set_layers(TrainConfig& c, const json& v) {
  c.lora.peft.layers_to_transform.clear();
  if (v.is_number_integer()) c.lora.peft.layers_to_transform = {v.get<int64_t>()};
  else if (v.is_array()) c.lora.peft.layers_to_transform = v.get<std::vector<int64_t>>();
}

std::string pattern_problem(const json& v) {
  if (!v.is_object()) return "must be an object of {module pattern: value}";
  for (const auto& [k, x] : v.items())
    if (!x.is_number()) return "must map each pattern to a number (\"" + k + "\" does not)";
  return "";
}

}  // namespace

std::vector<ConfigKey> lora() {
  std::vector<ConfigKey> rows = {
    key(OWN, "lora.enabled", FIELD(lora.enabled),
        "fine-tune LoRA adapters on a frozen base (PEFT's LoraConfig; LoRA adapters) instead of every weight"),
    key(OWN, "lora.config", FIELD(lora.config),
        "PEFT's adapter_config.json, read as this section's keys (a key shardlm lacks is refused when not at PEFT's "
        "default)")
        .optional("none").only_if(lora_on, "with lora.enabled"),
    key(OWN, "lora.init_from", FIELD(lora.init_from),
        "an adapter directory (adapter_model.safetensors; its adapter_config.json when lora.config is absent) to start "
        "from")
        .optional("none").only_if(lora_on, "with lora.enabled"),
    key(OWN, "lora.r", FIELD(lora.peft.r), "the adapters' rank").above(0),
    key(OWN, "lora.lora_alpha", FIELD(lora.peft.lora_alpha), "scaling = lora_alpha / r (/ sqrt(r) with use_rslora)")
        .finite(),
    key(OWN, "lora.lora_dropout", FIELD(lora.peft.lora_dropout), "dropout on the adapters' input (training only)")
        .within_below(0, 1),
    custom(OWN, "lora.target_modules", "list of strings or string",
           "the adapted linears: names (a module name equal to one or ending in .name), one regex (a full match of "
           "names like model.layers.0.self_attn.q_proj) or \"all-linear\" (all but the head); absent: PEFT's default "
           "for the model type (q_proj, v_proj)",
           targets_problem, set_targets, get_targets)
        .optional("PEFT's default for the model type"),
    key(OWN, "lora.target_parameters", FIELD(lora.peft.target_parameters),
        "the experts' 3-D weights adapted as PEFT's target_parameters (lora.ParamWrapper): names such as "
        "\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\" (a parameter name equal to one or ending in .name); "
        "per-expert A [r*E, in] and B [out, r*E]; with them and no target_modules, no linear is adapted"),
    key(OWN, "lora.use_rslora", FIELD(lora.peft.use_rslora), "rank-stabilised LoRA: scaling = lora_alpha / sqrt(r)"),
    custom(OWN, "lora.init_lora_weights", "bool or string",
           "true: A Kaiming-uniform (nn.Linear's), B zero; \"gaussian\": A normal(0, 1/r), B zero; false: both "
           "Kaiming-uniform (not an identity at start)",
           init_problem, set_init, get_init),
    key(OWN, "lora.bias", FIELD(lora.bias), "which biases train; only \"none\" (every bias stays frozen)")
        .choice("none", "no bias trains (PEFT's default)"),
    key(OWN, "lora.modules_to_save", FIELD(lora.peft.modules_to_save),
        "modules trained in full beside the adapters: \"lm_head\", \"embed_tokens\" (untied embeddings)"),
    custom(OWN, "lora.layers_to_transform", "integer or list of integers",
           "with target_modules names: adapt only these decoder layers (0-based); empty: all",
           layers_problem, set_layers, [](const TrainConfig& c) { return json(c.lora.peft.layers_to_transform); }),
    custom(OWN, "lora.rank_pattern", "object", "{pattern: r}: r for the modules whose name ends in the pattern (regex)",
           pattern_problem,
           [](TrainConfig& c, const json& v) { c.lora.peft.rank_pattern = v.get<std::map<std::string, int64_t>>(); },
           [](const TrainConfig& c) { return json(c.lora.peft.rank_pattern); }),
    custom(OWN, "lora.alpha_pattern", "object",
           "{pattern: alpha}: lora_alpha for the modules whose name ends in the pattern (regex)", pattern_problem,
           [](TrainConfig& c, const json& v) { c.lora.peft.alpha_pattern = v.get<std::map<std::string, double>>(); },
           [](const TrainConfig& c) { return json(c.lora.peft.alpha_pattern); }),
    key(OWN, "lora.use_dora", FIELD(lora.use_dora), "DoRA (weight-decomposed LoRA); only false")
        .refusing(true, "DoRA (weight-decomposed LoRA) is not implemented; set lora.use_dora to false or remove it"),
  };
  // train_config.json holds the section only for a LoRA run (it reloads without "lora.r is set but ...").
  for (auto& k : rows)
    if (k.path != "lora.enabled") k.written = lora_on;
  return rows;
}

}  // namespace shardlm::train::keys
