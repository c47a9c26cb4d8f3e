// A trained model as a Hugging Face model directory: model.safetensors, config.json and the
// tokenizer under the name `shardlm generate` (and transformers) look for. It lives here, beside
// write_hf_config, so that what makes a folder loadable by from_pretrained is said in one place,
// not in the trainer's step loop.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "model/llama_config.h"

namespace shardlm::model {

// Writes `tensors` (HF names; fused MoE experts are written one tensor per expert, as
// save_pretrained does), cfg's config.json and, when `tokenizer` is not empty, a copy of that
// tokenizer (a folder's tokenizer.json or the file itself, data/tokenizer/tokenizer.h) into `dir`, which exists,
// with a tokenizer.json's companion files (tokenizer_config.json, chat template, generation_config.json).
void write_hf_model_dir(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const LlamaConfig& cfg, const std::string& tokenizer);

}  // namespace shardlm::model
