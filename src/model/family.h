// One descriptor per model family shardlm reads and writes: everything that tells llama, mistral,
// qwen2, qwen3, mixtral, qwen2_moe and qwen3_moe apart (docs/model-families.md). The decoder
// (llama.cpp, moe.cpp), config.json reading (hf_config.cpp), validation (llama_config.cpp) and the
// key table (hf_config_keys.cpp) ask a family's descriptor instead of comparing model_type
// names. Each family is one file, src/model/families/<model_type>.cpp, listed once in family.cpp's
// table; adding a family is that file, its line in the table and its tests (CONTRIBUTING.md).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::model {

struct LlamaConfig;

// Which layers attend through a sliding window, and what the window keys may hold.
enum class Windows {
  Refused,     // llama: no window; a sliding_window other than null is refused (transformers ignores it)
  EveryLayer,  // mistral, mixtral: sliding_window applies to every layer (null: none)
  PerLayer,    // qwen2: use_sliding_window, then max_window_layers or layer_types choose the layers
  Off,         // qwen2_moe, qwen3, qwen3_moe: the keys are read, only "no window" is implemented
};

// Whether a family has routed experts (model/moe.h).
enum class Experts {
  None,      // dense only
  Always,    // mixtral: every layer sparse, num_local_experts must be positive
  Optional,  // qwen2_moe, qwen3_moe: layers chosen by decoder_sparse_step and mlp_only_layers; 0 experts: dense
};

// Where the q, k and v projections take a bias from.
enum class QkvBias {
  AttentionBias,  // llama, mistral, mixtral, qwen3, qwen3_moe: the attention_bias key (which biases o too)
  Always,         // qwen2: always, and never on o
  QkvBiasKey,     // qwen2_moe: its qkv_bias key (default true), never on o
};

// Where a family's experts live in its safetensors files: model.layers.N.<block>.experts.E.<gate|up|down>.
struct ExpertFileNames {
  const char* block = "mlp";
  const char* gate = "gate_proj.weight";
  const char* up = "up_proj.weight";
  const char* down = "down_proj.weight";
};

struct Family {
  const char* model_type = "";
  const char* architecture = "";  // transformers' class ("Qwen3ForCausalLM"), written by export
  // The keys it reads beyond those every family reads (the rows of hf_config_keys.cpp whose families
  // column says "" = all): a family-specific row applies to the families that list it here.
  std::vector<const char*> keys;
  // transformers' class defaults for the keys a config.json may omit (configuration_<type>.py), set
  // on a LlamaConfig that already holds every family's common ones (hf_config.cpp).
  void (*defaults)(LlamaConfig&) = nullptr;
  // transformers' LlamaConfig: an absent num_key_value_heads is num_attention_heads (the other
  // classes default it), and hidden_size must divide by the heads even when head_dim is given.
  bool kv_heads_default_to_heads = false;
  bool heads_must_divide_hidden = false;

  // Attention.
  QkvBias qkv_bias = QkvBias::AttentionBias;
  bool qk_norm = false;  // q_norm / k_norm: RMSNorm over each head's values before RoPE
  Windows windows = Windows::Off;

  // Sparse mixture of experts.
  Experts experts = Experts::None;
  const char* expert_count_key = "num_experts";         // the key that counts them, for messages
  bool experts_of_intermediate_size = false;            // mixtral: experts are intermediate_size wide
  bool shared_expert = false;                           // qwen2_moe: a gated shared expert, required
  bool always_renormalise = false;                      // mixtral: top-k weights always sum to 1
  bool router_weights_float32 = false;                  // mixtral: routing weights stay float32
  bool router_after_experts = false;                    // qwen3_moe: mlp.gate registered after the experts
  ExpertFileNames expert_files;

  // PEFT's default LoRA targets for the model type (peft.utils.constants.
  // TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), used when lora.target_modules is absent;
  // empty where PEFT has none and asks for target_modules (qwen2_moe, qwen3_moe).
  std::vector<const char*> peft_default_lora_targets;

  // Export: the keys of its class that config.json gets beyond every family's (to_hf_json).
  void (*export_keys)(const LlamaConfig&, nlohmann::json&) = nullptr;
};

// The descriptor of `model_type`; throws shardlm::Error naming the families it reads for any other.
const Family& family(const std::string& model_type);
// Every family, in the table's order (the order `plan --hf-keys` and errors list them).
const std::vector<const Family*>& families();

// What several families export alike, for their descriptor files (families/*.cpp).
namespace family_parts {
// The sparse block's keys of qwen2_moe and qwen3_moe.
void export_sparse_block(const LlamaConfig& c, nlohmann::json& j);
// A family whose windows are Off: no window, and max_window_layers as read.
void export_windows_off(const LlamaConfig& c, nlohmann::json& j);
}  // namespace family_parts

}  // namespace shardlm::model
