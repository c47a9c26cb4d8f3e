// qwen3_moe (Qwen3MoeForCausalLM, configuration_qwen3_moe.py): Qwen3 whose sparse layers route to
// experts of moe_intermediate_size without a shared expert, its router registered after the experts.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& qwen3_moe_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "qwen3_moe";
    f.architecture = "Qwen3MoeForCausalLM";
    // num_local_experts: transformers 5's name for num_experts.
    f.keys = {"attention_bias",      "use_sliding_window",   "max_window_layers",   "layer_types",
              "num_local_experts",   "num_experts",          "num_experts_per_tok", "norm_topk_prob",
              "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",     "router_aux_loss_coef",
              "output_router_logits", "moe_capacity_factor"};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 32768;
      c.num_key_value_heads = 4;
      c.head_dim_value = 0;
      c.sliding_window.reset();
      c.bos_token_id.reset();
      c.eos_token_ids.clear();
      c.num_experts = 128;
      c.num_experts_per_tok = 8;
      c.norm_topk_prob = false;
      c.moe_intermediate_size = 768;
    };
    f.qkv_bias = QkvBias::AttentionBias;
    f.qk_norm = true;
    f.windows = Windows::Off;
    f.experts = Experts::Optional;
    f.router_after_experts = true;
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      j["attention_bias"] = c.attention_bias;
      family_parts::export_windows_off(c, j);
      family_parts::export_sparse_block(c, j);
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
