// mistral (MistralForCausalLM, configuration_mistral.py): Llama with a sliding attention window on
// every layer.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& mistral_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "mistral";
    f.architecture = "MistralForCausalLM";
    f.peft_default_lora_targets = {"q_proj", "v_proj"};
    f.keys = {};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 4096 * 32;
      c.sliding_window = 4096;
      c.num_key_value_heads = 8;
    };
    f.windows = Windows::EveryLayer;
    f.export_keys = [](const LlamaConfig&, nlohmann::json&) {};  // sliding_window: every windowed family's
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
