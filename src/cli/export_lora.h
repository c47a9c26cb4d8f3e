// `shardlm export` of a LoRA run's adapter, as it is or merged into its base (export_lora.cpp).
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace shardlm::cli {

// Whether `dir` holds a PEFT adapter (adapter_model.safetensors).
bool is_adapter_dir(const std::string& dir);
// Writes the adapter into out_dir in `dtype`, or with merge the base with the adapter merged in as a
// Hugging Face model directory; base: the base model directory ("" : the adapter's base_model_name_or_path).
// Returns the base directory it merged into ("" without merge).
std::string export_adapter(const std::string& run_dir, const std::string& out_dir, at::ScalarType dtype, bool merge,
                    std::string base);

}  // namespace shardlm::cli
