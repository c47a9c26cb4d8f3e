// PEFT's LoraConfig keys as the model reads them (model/lora.h resolves them into adapters), in a
// header without torch's, so the planner's request (plan/planner.h) can carry them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm::model {

// PEFT LoraConfig's keys as the model reads them (train/ fills them from the `lora` section).
struct LoraOptions {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  // Exactly one of: module names (matched as PEFT does: the name equals, or ends with "." + it),
  // a regex (full match of the module name, e.g. "model.layers.0.self_attn.q_proj"),
  // "all-linear" (every linear but the output head), or none given: PEFT's default for the model type.
  std::vector<std::string> target_modules;
  std::string target_regex;
  bool use_rslora = false;
  std::string init_lora_weights = "true";  // "true" (Kaiming-uniform A, zero B) | "gaussian" | "false"
  std::vector<std::string> modules_to_save;  // "lm_head", "embed_tokens"
  std::vector<int64_t> layers_to_transform;  // empty: every layer (ignored with a regex, as PEFT)
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  // PEFT's target_parameters: names of the experts' 3-D weights ("mlp.experts.gate_up_proj",
  // "mlp.experts.down_proj"), matched as target_modules' names are; each gets a ParamWrapper adapter
  // (model/lora.h, expert adapters). With them and no target_modules, no linear is adapted (PEFT's
  // LoraConfig then sets target_modules to an empty set, not the model type's default).
  std::vector<std::string> target_parameters;
};

}  // namespace shardlm::model
