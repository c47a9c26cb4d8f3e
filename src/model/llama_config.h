// The decoder's hyper-parameters under Hugging Face config.json field names, for every family that
// is a Llama with small changes: llama (LlamaForCausalLM), mistral (a sliding attention window),
// qwen2 (q/k/v biases, per-layer windows), and the sparse mixture-of-experts families mixtral (every
// MLP a routed set of SwiGLU experts) and qwen2_moe (routed experts plus a gated shared expert);
// qwen3 (per-head RMSNorm of q and k before RoPE) and its sparse form qwen3_moe (no shared expert). A config.json from the Hub reads in as transformers
// reads it — its family's defaults for absent keys, rope_theta + rope_scaling (4.x) or
// rope_parameters (5.x) — and one we write loads in transformers as the same model. Every key is
// honoured, listed as math-neutral (model/hf_config_keys.h) or refused naming key and value.
#pragma once
#include <c10/core/ScalarType.h>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::model {

struct Family;

// transformers' rope_parameters after its standardisation (modeling_rope_utils.py): the type, the
// base, and the optional parameters of that type exactly as the file gave them (so export writes
// back what was read). Types: default, linear, dynamic, yarn, longrope, llama3.
struct RopeParameters {
  std::string type = "default";
  double theta = 10000.0;
  std::optional<double> factor;                         // linear, dynamic, yarn, llama3, (longrope)
  std::optional<int64_t> original_max_position_embeddings;  // yarn, longrope, llama3
  std::optional<double> attention_factor;               // yarn, longrope
  std::optional<double> beta_fast, beta_slow, mscale, mscale_all_dim;  // yarn
  std::optional<bool> truncate;                         // yarn (transformers' default: true)
  std::vector<double> short_factor, long_factor;        // longrope
  std::optional<double> low_freq_factor, high_freq_factor;  // llama3
  bool operator==(const RopeParameters& o) const;
};

struct LlamaConfig {
  std::string model_type = "llama";  // "llama" | "mistral" | "qwen2" | "mixtral" | "qwen2_moe" | "qwen3" | "qwen3_moe"
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim_value = 0;  // config.json's head_dim; 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-5;
  RopeParameters rope;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // llama's attention_bias (q, k, v and o) and mlp_bias (gate, up, down); qwen2 always has q/k/v
  // biases and no o bias (its config has no such keys).
  bool attention_bias = false;
  bool mlp_bias = false;
  // Sliding-window attention: a query at i sees keys j with i - sliding_window < j <= i, on the
  // layers whose layer_types entry is "sliding_attention" (mistral: every layer when the window is
  // set; qwen2: from use_sliding_window / max_window_layers, or layer_types as given).
  std::optional<int64_t> sliding_window;
  bool use_sliding_window = false;  // qwen2
  int64_t max_window_layers = 28;   // qwen2
  std::vector<std::string> layer_types;  // qwen2, as given (empty: derived)
  // Token ids as config.json gives them (eos may be a list); nullopt: null or absent.
  std::optional<int64_t> bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};
  bool eos_is_list = false;
  std::optional<int64_t> pad_token_id;
  // Sparse mixture of experts (model/moe.h; mixtral, qwen2_moe). num_experts 0: a dense model.
  // mixtral: num_local_experts, every layer sparse, experts of intermediate_size, top-k weights
  // always renormalised. qwen2_moe: num_experts, layer i sparse iff i is not in mlp_only_layers and
  // (i + 1) % decoder_sparse_step == 0 (other layers: a dense MLP of intermediate_size), experts of
  // moe_intermediate_size, norm_topk_prob, and a shared expert of shared_expert_intermediate_size
  // scaled by sigmoid(shared_expert_gate(x)).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 2;
  bool norm_topk_prob = true;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // transformers' load-balancing loss: added to the loss times router_aux_loss_coef only when
  // output_router_logits is true (its default: false), as MixtralForCausalLM.forward adds it.
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  // Optional token dropping (GShard): each expert takes at most ceil(capacity_factor * tokens *
  // top_k / num_experts) assignments per layer and forward, first come first served in token order;
  // a dropped assignment contributes nothing (the token keeps its residual). 0: dropless (the
  // default, and what transformers computes). A shardlm key, not a config.json one.
  double moe_capacity_factor = 0.0;
  bool qkv_bias = true;  // qwen2_moe's qkv_bias key
  // What reading config.json accepted without using, one line each, for the commands to print
  // (auto_map's remote code, keys transformers does not read); not part of the model.
  std::vector<std::string> notices;

  bool is_moe() const { return num_experts > 0; }
  // Whether decoder layer `layer` has the sparse block (else the dense SwiGLU MLP).
  bool is_moe_layer(int64_t layer) const;
  // Width of one routed expert's SwiGLU.
  int64_t expert_intermediate_size() const;
  // q_norm / k_norm (qwen3, qwen3_moe), RMSNorms over each head's head_dim values before RoPE.
  bool has_qk_norm() const;

  int64_t head_dim() const { return head_dim_value > 0 ? head_dim_value : hidden_size / num_attention_heads; }
  bool has_qkv_bias() const;
  // Where attention_bias is the family's q/k/v bias key (llama, qwen3, qwen3_moe), it puts a bias on o too.
  bool has_o_bias() const;
  // Which family this is: its descriptor (model/family.h).
  const Family& family() const;
  // The window of decoder layer `layer` (0: full causal attention).
  int64_t window_of_layer(int64_t layer) const;
  // The HF architecture name of this family ("LlamaForCausalLM", ...).
  std::string architecture() const;
  // Throws shardlm::Error naming the inconsistent fields (e.g. heads not dividing hidden size).
  void validate() const;
  // Parameter count from the shapes (what the planner and the progress line report).
  int64_t num_parameters() const;
};

// Names accepted by preset(): "tiny", "demo", "llama-1b", "llama-7b", "llama-13b", "llama-70b".
LlamaConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// Applies config.json keys (`fields`) to `cfg` under the rule of model/hf_config_keys.h: honoured
// keys are read, math-neutral ones skipped, anything else refused naming key and value. `where`
// names the source in errors. Also the "model" section of a training config (a preset plus keys).
// `keys_transformers_ignores`: what to do with a key in neither table that transformers does not
// read for this model type: Accept (a config.json: named in cfg.notices, as transformers ignores it)
// or Refuse (a training config's model section, where such a key is a mistake).
enum class UnreadKeys { Accept, Refuse };
void apply_hf_fields(LlamaConfig& cfg, const nlohmann::json& fields, const std::string& where,
                     UnreadKeys keys_transformers_ignores = UnreadKeys::Refuse);
// A config.json as transformers reads it: the family's defaults for absent keys, shape keys
// required, validated.
LlamaConfig read_hf_config(const std::string& path);
LlamaConfig hf_config_from_json(const nlohmann::json& j, const std::string& where);
// config.json for transformers: every math-relevant key, in this family's own architecture, with
// rope written both ways (rope_parameters for transformers 5, rope_theta + rope_scaling for 4.x).
nlohmann::json to_hf_json(const LlamaConfig& cfg);
void write_hf_config(const std::string& path, const LlamaConfig& cfg);

// config.json's torch_dtype for tensors of `dtype`: "bfloat16", "float16", "float32" (anything else).
inline const char* hf_dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
}

}  // namespace shardlm::model
