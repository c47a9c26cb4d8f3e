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
};

}  // namespace shardlm::model
