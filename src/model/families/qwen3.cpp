// qwen3 (Qwen3ForCausalLM, configuration_qwen3.py): Llama plus an RMSNorm of each head's q and k
// before RoPE, attention_bias on q/k/v/o, head_dim 128 by default; no window implemented.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& qwen3_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "qwen3";
    f.architecture = "Qwen3ForCausalLM";
    f.peft_default_lora_targets = {"q_proj", "v_proj"};
    f.keys = {"attention_bias", "use_sliding_window", "max_window_layers", "layer_types"};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 32768;
      c.num_key_value_heads = 32;
      c.head_dim_value = 128;
      c.sliding_window.reset();
      c.bos_token_id.reset();
      c.eos_token_ids.clear();
    };
    f.qkv_bias = QkvBias::AttentionBias;
    f.qk_norm = true;
    f.windows = Windows::Off;
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      j["attention_bias"] = c.attention_bias;
      family_parts::export_windows_off(c, j);
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
