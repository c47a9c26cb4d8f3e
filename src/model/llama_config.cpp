// LlamaConfig itself: the questions the decoder asks (sparse layer, window, biases), answered from
// the family's descriptor (model/family.h), validation, and the presets. Reading and writing config.json is
// hf_config.cpp's job (RoPE dicts: hf_rope.cpp).
#include "model/llama_config.h"

#include <algorithm>
#include <string>
#include <vector>

#include "model/family.h"
#include "model/hf_rope.h"
#include "util/error.h"

namespace shardlm::model {

bool RopeParameters::operator==(const RopeParameters& o) const { return rope_dict(*this, true) == rope_dict(o, true); }

const Family& LlamaConfig::family() const { return model::family(model_type); }

int64_t LlamaConfig::expert_intermediate_size() const {
  return family().experts_of_intermediate_size ? intermediate_size : moe_intermediate_size;
}

bool LlamaConfig::has_qk_norm() const { return family().qk_norm; }

bool LlamaConfig::has_qkv_bias() const {
  const QkvBias from = family().qkv_bias;
  return from == QkvBias::Always || (from == QkvBias::QkvBiasKey && qkv_bias) || attention_bias;
}

bool LlamaConfig::has_o_bias() const { return family().qkv_bias == QkvBias::AttentionBias && attention_bias; }

bool LlamaConfig::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (family().experts == Experts::Always) return true;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() &&
         (layer + 1) % decoder_sparse_step == 0;
}

int64_t LlamaConfig::window_of_layer(int64_t layer) const {
  const Windows windows = family().windows;
  if (windows == Windows::EveryLayer) return sliding_window.value_or(0);
  if (windows != Windows::PerLayer || !use_sliding_window || !sliding_window) return 0;
  const bool sliding = layer_types.empty() ? layer >= max_window_layers
                                           : layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  return sliding ? *sliding_window : 0;
}

std::string LlamaConfig::architecture() const { return family().architecture; }

void LlamaConfig::validate() const {
  const Family& fam = family();
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_hidden_layers <= 0 ||
      num_attention_heads <= 0 || num_key_value_heads <= 0 || max_position_embeddings <= 0 || head_dim_value < 0)
    fail("model config: sizes must be positive (vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
         "num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings)");
  // transformers' LlamaConfig refuses this even with head_dim given; the others only need it to derive head_dim.
  if ((head_dim_value == 0 || fam.heads_must_divide_hidden) && hidden_size % num_attention_heads != 0)
    fail("model config: hidden_size ", hidden_size, " is not divisible by num_attention_heads ", num_attention_heads);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("model config: num_attention_heads ", num_attention_heads, " is not a multiple of num_key_value_heads ",
         num_key_value_heads, " (grouped-query attention shares each key/value head among a whole group)");
  if (head_dim() % 2 != 0) fail("model config: head_dim ", head_dim(), " must be even for rotary embeddings");
  if (rms_norm_eps <= 0 || rope.theta <= 0) fail("model config: rms_norm_eps and rope_theta must be positive");
  if (rope.factor && *rope.factor <= 0) fail("model config: the rope factor must be positive, got ", *rope.factor);
  if (rope.type == "longrope") {
    const size_t half = static_cast<size_t>(head_dim() / 2);
    if (rope.short_factor.size() != half || rope.long_factor.size() != half)
      fail("model config: longrope's short_factor and long_factor need head_dim/2 = ", half, " values each, got ",
           rope.short_factor.size(), " and ", rope.long_factor.size());
  }
  if (sliding_window && *sliding_window <= 0)
    fail("model config: sliding_window must be a positive number of positions or null, got ", *sliding_window);
  if (!layer_types.empty() && static_cast<int64_t>(layer_types.size()) != num_hidden_layers)
    fail("model config: layer_types has ", layer_types.size(), " entries for ", num_hidden_layers, " layers");
  if (num_experts < 0) fail("model config: num_experts must be >= 0, got ", num_experts);
  if (is_moe()) {
    const char* count_key = fam.expert_count_key;
    if (num_experts_per_tok <= 0)
      fail("model config: num_experts_per_tok must be positive, got ", num_experts_per_tok);
    if (num_experts_per_tok > num_experts)
      fail("model config: num_experts_per_tok (top-k) = ", num_experts_per_tok, " exceeds ", count_key, " = ",
           num_experts, ": a token cannot be routed to more experts than exist; set num_experts_per_tok <= ",
           num_experts);
    if (expert_intermediate_size() <= 0)
      fail("model config: the experts' width (",
           fam.experts_of_intermediate_size ? "intermediate_size" : "moe_intermediate_size",
           ") must be positive");
    if (fam.shared_expert && shared_expert_intermediate_size <= 0)
      fail("model config: shared_expert_intermediate_size must be positive for ", model_type, " (transformers always "
           "builds the shared expert), got ", shared_expert_intermediate_size);
    if (!fam.shared_expert && shared_expert_intermediate_size != 0)
      fail("model config: ", model_type, " has no shared expert (shared_expert_intermediate_size must be 0)");
    if (decoder_sparse_step <= 0)
      fail("model config: decoder_sparse_step must be positive (transformers takes (i + 1) % step), got ",
           decoder_sparse_step);
    for (auto l : mlp_only_layers)
      if (l < 0 || l >= num_hidden_layers)
        fail("model config: mlp_only_layers names layer ", l, ", outside 0..", num_hidden_layers - 1);
    if (moe_capacity_factor < 0)
      fail("model config: moe_capacity_factor must be 0 (dropless) or positive, got ", moe_capacity_factor);
    if (router_aux_loss_coef < 0)
      fail("model config: router_aux_loss_coef must be >= 0, got ", router_aux_loss_coef);
  } else if (fam.experts == Experts::Always) {
    // Experts::Optional families with num_experts 0 are dense in transformers too; mixtral has no dense form.
    fail("model config: ", fam.expert_count_key, " must be positive for ", model_type);
  }
}

LlamaConfig preset(const std::string& name) {
  LlamaConfig c;
  if (name == "tiny") {  // the parity-test model (tests/golden/tiny)
    c.vocab_size = 128; c.hidden_size = 64; c.intermediate_size = 176; c.num_hidden_layers = 2;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.max_position_embeddings = 128;
  } else if (name == "demo") {  // ~12.6M parameters: learns visibly in minutes on 2 CPU cores
    c.vocab_size = 4096; c.hidden_size = 384; c.intermediate_size = 1024; c.num_hidden_layers = 6;
    c.num_attention_heads = 6; c.num_key_value_heads = 2; c.max_position_embeddings = 1024;
  } else if (name == "llama-1b") {  // TinyLlama-1.1B's shape: the GPU speed check's model
    c.vocab_size = 32000; c.hidden_size = 2048; c.intermediate_size = 5632; c.num_hidden_layers = 22;
    c.num_attention_heads = 32; c.num_key_value_heads = 4; c.max_position_embeddings = 2048;
  } else if (name == "llama-7b") {
    c.vocab_size = 32000; c.hidden_size = 4096; c.intermediate_size = 11008; c.num_hidden_layers = 32;
    c.num_attention_heads = 32; c.num_key_value_heads = 32; c.max_position_embeddings = 4096;
  } else if (name == "llama-13b") {
    c.vocab_size = 32000; c.hidden_size = 5120; c.intermediate_size = 13824; c.num_hidden_layers = 40;
    c.num_attention_heads = 40; c.num_key_value_heads = 40; c.max_position_embeddings = 4096;
  } else if (name == "llama-70b") {
    c.vocab_size = 32000; c.hidden_size = 8192; c.intermediate_size = 28672; c.num_hidden_layers = 80;
    c.num_attention_heads = 64; c.num_key_value_heads = 8; c.max_position_embeddings = 4096;
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown model preset '", name, "'; valid presets: ", names);
  }
  return c;
}

std::vector<std::string> preset_names() { return {"tiny", "demo", "llama-1b", "llama-7b", "llama-13b", "llama-70b"}; }

}  // namespace shardlm::model
