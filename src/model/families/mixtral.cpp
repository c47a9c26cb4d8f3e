// mixtral (MixtralForCausalLM, configuration_mixtral.py): Mistral whose every MLP is a routed set of
// SwiGLU experts of intermediate_size, top-k weights always renormalised and kept in float32, stored
// per expert as block_sparse_moe.experts.E.w1/w3/w2.
#include <nlohmann/json.hpp>

#include "model/family.h"
#include "model/llama_config.h"

namespace shardlm::model {

const Family& mixtral_family() {
  static const Family f = [] {
    Family f;
    f.model_type = "mixtral";
    f.architecture = "MixtralForCausalLM";
    f.peft_default_lora_targets = {"q_proj", "v_proj"};
    f.keys = {"num_local_experts",    "num_experts_per_tok", "router_aux_loss_coef",
              "output_router_logits", "router_jitter_noise", "moe_capacity_factor"};
    f.defaults = [](LlamaConfig& c) {
      c.max_position_embeddings = 4096 * 32;
      c.rms_norm_eps = 1e-5;
      c.num_key_value_heads = 8;
      c.rope.theta = 1e6;
      c.num_experts = 8;
      c.num_experts_per_tok = 2;
      c.norm_topk_prob = true;
    };
    f.windows = Windows::EveryLayer;
    f.experts = Experts::Always;
    f.expert_count_key = "num_local_experts";
    f.experts_of_intermediate_size = true;
    f.always_renormalise = true;
    f.router_weights_float32 = true;
    f.expert_files = {"block_sparse_moe", "w1.weight", "w3.weight", "w2.weight"};
    f.export_keys = [](const LlamaConfig& c, nlohmann::json& j) {
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["output_router_logits"] = c.output_router_logits;
      j["router_jitter_noise"] = 0.0;
    };
    return f;
  }();
  return f;
}

}  // namespace shardlm::model
