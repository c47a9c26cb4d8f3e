// llama (LlamaForCausalLM, configuration_llama.py): the decoder every other family changes a little.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& llama_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "llama";
    f.architecture = "LlamaForCausalLM";
    f.peft_default_lora_targets = {"q_proj", "v_proj"};
    f.keys = {"attention_bias", "mlp_bias"};
    f.defaults = [](LlamaConfig&) {};  // rms_norm_eps 1e-6 and 2048 positions: every family's base
    f.kv_heads_default_to_heads = true;
    f.heads_must_divide_hidden = true;  // LlamaConfig checks it even when head_dim is given
    f.qkv_bias = QkvBias::AttentionBias;
    f.windows = Windows::Refused;  // LlamaForCausalLM ignores sliding_window
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
