// The lora section turned into the model's adapters: PEFT's adapter_config.json read as the section
// (lora.config, or lora.init_from's), the adapter directory to start from, and PEFT's file written
// on export. The keys themselves are rows of train/keys/lora.cpp.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/llama.h"
#include "train/config.h"

namespace shardlm::train {

// Reads PEFT's adapter_config.json into `lora` (every key PEFT writes: the ones shardlm implements
// set the options, the others must hold PEFT's default or are refused by name).
void read_peft_adapter_config(const nlohmann::json& j, const std::string& where, LoraConfig& lora);
// The options the run uses: lora.config or init_from/adapter_config.json when given, else the section.
model::LoraOptions lora_options(const LoraConfig& lora);
// Applies the adapters to a model holding its base weights; loads lora.init_from's adapters.
void apply_lora(model::Llama& model, const LoraConfig& lora, uint64_t seed);
// adapter_config.json as PEFT 0.22.0 writes it for these adapters (every key, PEFT's defaults for
// what shardlm does not use). base: base_model_name_or_path (may be empty).
nlohmann::json peft_adapter_config(const model::Llama& model, const std::string& base);
// Adapter tensors under PEFT's saved names ("base_model.model." + name) from the model's named tensors.
std::vector<std::pair<std::string, at::Tensor>> peft_adapter_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named);

// Writes adapter_model.safetensors (tensors: the model's trainable ones by their names) and
// adapter_config.json into dir. base: the base model's directory, for base_model_name_or_path.
void write_peft_adapter_dir(const std::string& dir, const model::Llama& model,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& base);

}  // namespace shardlm::train
