// The config.json keys the pinned transformers reads for each model type shardlm trains (generated
// into hf_transformers_reads.cpp by tests/reference/make_hf_config_reads.py). A key of a config.json
// that is neither in shardlm's own table (hf_config_keys.h) nor read by transformers changes nothing
// transformers builds, so shardlm accepts it naming it, as transformers ignores it; a key transformers
// reads that shardlm does not know stays refused.
#pragma once
#include <string>
#include <vector>

namespace shardlm::model {

// The transformers version the table was generated from ("5.23.0").
const char* transformers_pin();
// Whether transformers reads `key` from a config.json of `model_type` (true for a type without a table).
bool transformers_reads(const std::string& model_type, const std::string& key);

}  // namespace shardlm::model
