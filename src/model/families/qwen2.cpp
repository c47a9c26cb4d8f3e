// qwen2 (Qwen2ForCausalLM, configuration_qwen2.py): Llama with q/k/v biases (none on o) and a
// window on the layers use_sliding_window, max_window_layers or layer_types choose.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& qwen2_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "qwen2";
    f.architecture = "Qwen2ForCausalLM";
    f.peft_default_lora_targets = {"q_proj", "v_proj"};
    f.keys = {"use_sliding_window", "max_window_layers", "layer_types", "use_mrope"};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 32768;
      c.sliding_window = 4096;
      c.num_key_value_heads = 32;
      c.bos_token_id.reset();
      c.eos_token_ids.clear();
    };
    f.qkv_bias = QkvBias::Always;
    f.windows = Windows::PerLayer;
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      j["use_sliding_window"] = c.use_sliding_window;
      j["max_window_layers"] = c.max_window_layers;
      if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
