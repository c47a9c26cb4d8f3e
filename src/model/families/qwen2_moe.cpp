// qwen2_moe (Qwen2MoeForCausalLM, configuration_qwen2_moe.py): Qwen2 whose sparse layers (by
// decoder_sparse_step and mlp_only_layers) route to experts of moe_intermediate_size plus a shared
// expert scaled by sigmoid(shared_expert_gate(x)); q/k/v biases from qkv_bias; no window implemented.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& qwen2_moe_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "qwen2_moe";
    f.architecture = "Qwen2MoeForCausalLM";
    f.keys = {"use_sliding_window",   "max_window_layers",    "layer_types",
              "qkv_bias",             "num_experts",          "num_experts_per_tok",
              "norm_topk_prob",       "moe_intermediate_size", "shared_expert_intermediate_size",
              "decoder_sparse_step",  "mlp_only_layers",      "router_aux_loss_coef",
              "output_router_logits", "moe_capacity_factor"};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 32768;
      c.num_key_value_heads = 16;
      c.bos_token_id.reset();
      c.eos_token_ids.clear();
      c.num_experts = 60;
      c.num_experts_per_tok = 4;
      c.norm_topk_prob = false;
      c.moe_intermediate_size = 1408;
      c.shared_expert_intermediate_size = 5632;
    };
    f.qkv_bias = QkvBias::QkvBiasKey;
    f.windows = Windows::Off;
    f.experts = Experts::Optional;
    f.shared_expert = true;
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      family_parts::export_sparse_block(c, j);
      j["qkv_bias"] = c.qkv_bias;
      j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      family_parts::export_windows_off(c, j);
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
