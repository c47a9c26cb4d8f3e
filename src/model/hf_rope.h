// config.json's RoPE dicts <-> RopeParameters, as transformers 5 standardises them
// (modeling_rope_utils.py's convert_rope_params_to_dict / standardize_rope_params): the keys each rope
// type reads, the 4.x `type` name, and the dict written back. Read and written by hf_config.cpp.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/llama_config.h"

namespace shardlm::model {

// Whether rope type `t` reads original_max_position_embeddings (yarn, longrope, llama3).
bool uses_original_length(const std::string& t);

// One RoPE dict (rope_parameters, or 4.x's rope_scaling with `type` as the old name of rope_type),
// found under `key`; rope_theta defaults to `fallback_theta`. Refuses unknown types and keys a type
// does not read, naming them. `where` names the source in errors.
RopeParameters parse_rope_dict(const nlohmann::json& d, const std::string& key, double fallback_theta,
                               const std::string& where);

// The dict transformers 5 writes (`with_theta`: rope_parameters) or 4.x's rope_scaling (without).
nlohmann::json rope_dict(const RopeParameters& r, bool with_theta);

}  // namespace shardlm::model
