// One rule for every key a Hugging Face config.json of a supported family may hold: the key is
// honoured (read into LlamaConfig, some values refused there), or math-neutral with a one-line
// why (it changes nothing the trainer computes). A key not in this table is refused naming it when
// the pinned transformers reads it for the model type (hf_transformers_reads.h): a trainer that
// drops a key the model depends on may train a different model without a word. A key transformers
// never reads either (a tool's own flag: selective_checkpoint_enabled, internal_version) changes
// nothing transformers builds, and is accepted with one line naming it.
// `shardlm plan --hf-keys` prints this table (docs/model-families.md).
#pragma once
#include <string>
#include <vector>

namespace shardlm::model {

enum class KeyUse { Honoured, Neutral };

struct HfConfigKey {
  const char* key;
  KeyUse use;
  bool per_family;  // false: every family reads it; true: the families whose descriptor lists it (model/family.h)
  const char* why;  // honoured: what it sets; neutral: why it changes nothing here
};

const std::vector<HfConfigKey>& hf_config_keys();
// The entry of `key` for `model_type`, or nullptr (an unknown key: refused).
const HfConfigKey* find_hf_config_key(const std::string& key, const std::string& model_type);
// The families shardlm reads, in the order of model/family.h's table: "llama", "mistral", "qwen2",
// "mixtral", "qwen2_moe", "qwen3", "qwen3_moe".
const std::vector<std::string>& hf_model_types();
// The families that read `k`: "all", or their names separated by spaces ("llama qwen3 qwen3_moe").
std::string hf_config_key_families(const HfConfigKey& k);
// Markdown table of the keys (`shardlm plan --hf-keys`).
std::string hf_config_keys_markdown();

}  // namespace shardlm::model
