// See hf_config_keys.h. The honoured keys are read in hf_config.cpp (apply_hf_fields), which
// refuses a key marked honoured here that it does not handle, so the two cannot drift apart. Which
// family reads a per-family key is its descriptor's list (model/family.h); the table checks once
// that the two agree.
#include "model/hf_config_keys.h"

#include <algorithm>
#include <cstring>

#include "model/family.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

constexpr KeyUse H = KeyUse::Honoured;
constexpr KeyUse N = KeyUse::Neutral;
constexpr bool ALL = false;  // every family reads the key
constexpr bool FAM = true;   // the families whose descriptor lists it

const char* kGeneration = "a generation default (transformers' GenerationConfig); `shardlm generate` takes its own flags";
const char* kOutputs = "an output option of transformers' forward (what it returns), not of the model's math";
const char* kHeads = "for classification heads; a causal LM has none";
const char* kEncDec = "an encoder-decoder setting; transformers' decoder-only models do not read it";

std::vector<HfConfigKey> make_table() {
  std::vector<HfConfigKey> t = {
      // The family and its shape.
      {"model_type", H, ALL, "the family: llama, mistral, qwen2, mixtral, qwen2_moe, qwen3 or qwen3_moe (absent: llama)"},
      {"architectures", H, ALL,
       "a causal LM (…ForCausalLM: transformers takes the class from model_type); other heads are refused"},
      {"vocab_size", H, ALL, "vocabulary rows of the embedding and the head"},
      {"hidden_size", H, ALL, "width of the residual stream"},
      {"intermediate_size", H, ALL, "width of the SwiGLU MLP"},
      {"num_hidden_layers", H, ALL, "decoder layers"},
      {"num_attention_heads", H, ALL, "query heads"},
      {"num_key_value_heads", H, ALL, "key/value heads (grouped-query attention); absent: the family's default"},
      {"head_dim", H, ALL, "width of a head (may differ from hidden_size / num_attention_heads)"},
      {"max_position_embeddings", H, ALL, "longest sequence trained; the base length of dynamic RoPE"},
      {"rms_norm_eps", H, ALL, "RMSNorm epsilon"},
      {"initializer_range", H, ALL, "standard deviation of the initial weights of a model trained from scratch"},
      {"tie_word_embeddings", H, ALL, "the head reuses the embedding matrix"},
      {"hidden_act", H, ALL, "the MLP's activation: silu (swish) only; others are refused"},
      {"attention_dropout", H, ALL, "0 only: attention dropout is not implemented, other values are refused"},
      // Rotary embeddings.
      {"rope_theta", H, ALL, "RoPE base (transformers 4.x; 5.x keeps it in rope_parameters)"},
      {"rope_scaling", H, ALL,
       "RoPE type and parameters (transformers 4.x): default, linear, dynamic, yarn, longrope, llama3; others refused"},
      {"rope_parameters", H, ALL, "RoPE type, base and parameters (transformers 5.x); same types as rope_scaling"},
      {"partial_rotary_factor", H, ALL, "1.0 only: partial rotary embeddings are refused"},
      {"original_max_position_embeddings", H, ALL,
       "pretraining length of llama3/yarn/longrope RoPE (transformers moves it into the rope parameters)"},
      // Biases and windows.
      {"attention_bias", H, FAM, "biases on q, k, v and o"},
      {"mlp_bias", H, FAM, "biases on gate, up and down"},
      {"sliding_window", H, ALL,
       "attention window (mistral: every layer, null = none; qwen2: the sliding layers; llama: null only)"},
      {"use_sliding_window", H, FAM,
       "whether the sliding_window applies (qwen2: to the layers from max_window_layers on; the others: false only)"},
      {"max_window_layers", H, FAM,
       "layers before this one attend fully when use_sliding_window is set"},
      {"layer_types", H, FAM,
       "per layer full_attention or sliding_attention (overrides max_window_layers; all but qwen2: full_attention only)"},
      {"qkv_bias", H, FAM, "biases on q, k and v (default true)"},
      // Sparse mixture of experts (model/moe.h).
      {"num_local_experts", H, FAM,
       "routed experts per (sparse) layer (qwen3_moe: transformers 5's name for num_experts)"},
      {"num_experts", H, FAM, "routed experts per sparse layer (0: every layer dense)"},
      {"num_experts_per_tok", H, FAM, "experts each token is routed to (top-k); at most the expert count"},
      {"norm_topk_prob", H, FAM, "renormalise the top-k router probabilities to sum to 1 (mixtral always does)"},
      {"moe_intermediate_size", H, FAM, "width of each routed expert's SwiGLU"},
      {"shared_expert_intermediate_size", H, FAM,
       "width of the shared expert, scaled by sigmoid(shared_expert_gate(x)) and added to the routed output"},
      {"decoder_sparse_step", H, FAM, "layer i is sparse iff (i + 1) % decoder_sparse_step == 0"},
      {"mlp_only_layers", H, FAM, "layers with a dense MLP of intermediate_size instead of experts"},
      {"router_aux_loss_coef", H, FAM,
       "factor of the load-balancing loss added to the loss when output_router_logits is true"},
      {"output_router_logits", H, FAM,
       "true: the load-balancing loss times router_aux_loss_coef is added to the loss, as transformers adds it"},
      {"router_jitter_noise", H, FAM, "0 only: transformers' multiplicative router input noise is refused"},
      {"moe_capacity_factor", H, FAM,
       "shardlm's own (not transformers'): 0 = dropless (default); c > 0 = each expert takes at most "
       "ceil(c * tokens * top_k / experts) assignments per layer, the rest are dropped (GShard); not exported"},
      // Token ids.
      {"bos_token_id", H, ALL, "written back on export; the default first token of `shardlm generate`"},
      {"eos_token_id", H, ALL, "an id or a list; written back on export; stops `shardlm generate`"},
      {"pad_token_id", H, ALL, "written back on export (training data carries no padding here)"},
      // Settings whose other values change the model: refused unless they leave it as it is.
      {"is_encoder_decoder", H, ALL, "false only"},
      {"add_cross_attention", H, ALL, "false only"},
      {"pruned_heads", H, ALL, "empty only: pruned attention heads are not supported"},
      {"use_mrope", H, FAM, "false only: multimodal RoPE (Qwen2-VL) is not supported"},
      {"quantization_config", H, ALL, "refused: quantized checkpoints are not supported; give unquantized weights"},
      {"auto_map", H, ALL,
       "accepted with a notice: the repository's own modelling code is not run; the model_type's architecture is "
       "built, as transformers builds it without trust_remote_code"},
      // Math-neutral.
      {"transformers_version", N, ALL, "which transformers wrote the file"},
      {"torch_dtype", N, ALL,
       "the dtype the weights were saved in; safetensors carry their own dtype and the training precision is "
       "shardlm's bf16/fp16 keys"},
      {"dtype", N, ALL, "transformers 5's name for torch_dtype"},
      {"_name_or_path", N, ALL, "where transformers loaded the model from"},
      {"name_or_path", N, ALL, "where transformers loaded the model from"},
      {"_commit_hash", N, ALL, "the Hub revision the file came from"},
      {"use_cache", N, ALL, "the key/value cache of incremental decoding; training and eval run whole sequences"},
      {"pretraining_tp", N, ALL,
       "transformers 5 ignores it (4.x split the products into this many slices: the same math up to rounding)"},
      {"attn_implementation", N, ALL, "transformers' attention kernel; shardlm's attn_implementation key chooses its own"},
      {"_attn_implementation", N, ALL, "transformers' attention kernel; shardlm's attn_implementation key chooses its own"},
      {"_attn_implementation_autoset", N, ALL, "transformers' attention kernel bookkeeping"},
      {"experts_implementation", N, ALL, "transformers' kernel for the experts; the same math"},
      {"_experts_implementation", N, ALL, "transformers' kernel for the experts; the same math"},
      {"gradient_checkpointing", N, ALL,
       "transformers recomputes activations in backward: the same math; shardlm's activation_checkpointing chooses "
       "its own"},
      {"output_attentions", N, ALL, kOutputs},
      {"output_hidden_states", N, ALL, kOutputs},
      {"return_dict", N, ALL, kOutputs},
      {"use_return_dict", N, ALL, kOutputs},
      {"torchscript", N, ALL, "transformers' TorchScript export flag"},
      {"chunk_size_feed_forward", N, ALL, "transformers' Llama-family models do not read it"},
      {"use_bfloat16", N, ALL, "a legacy TensorFlow/Flax flag that transformers' PyTorch models do not read"},
      {"tf_legacy_loss", N, ALL, "a legacy TensorFlow flag that transformers' PyTorch models do not read"},
      {"id2label", N, ALL, kHeads},
      {"label2id", N, ALL, kHeads},
      {"num_labels", N, ALL, kHeads},
      {"problem_type", N, ALL, kHeads},
      {"finetuning_task", N, ALL, kHeads},
      {"is_decoder", N, ALL, kEncDec},
      {"tie_encoder_decoder", N, ALL, kEncDec},
      {"cross_attention_hidden_size", N, ALL, kEncDec},
      {"decoder_start_token_id", N, ALL, kEncDec},
      {"tokenizer_class", N, ALL, "which tokenizer class goes with the model (the tokenizer is data.tokenizer here)"},
      {"prefix", N, ALL, "a text prefix for generation pipelines"},
      {"sep_token_id", N, ALL, "a tokenizer id the decoder does not use"},
      {"task_specific_params", N, ALL, "generation pipelines' settings"},
      {"is_llama_config", N, ALL, "a flag of nanotron's exports (SmolLM); transformers does not read it"},
      {"rope_interleaved", N, ALL,
       "a flag of nanotron's exports (SmolLM); transformers does not read it and always rotates halves, as shardlm does"},
      {"transformers.js_config", N, ALL, "settings of transformers.js"},
      {"max_sequence_length", N, ALL,
       "an early LLaMA conversion's key that transformers does not read (max_position_embeddings is the length)"},
  };
  for (const char* g : {"assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
                        "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
                        "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff",
                        "exponential_decay_length_penalty", "forced_bos_token_id", "forced_eos_token_id",
                        "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_assistant_tokens",
                        "num_assistant_tokens_schedule", "num_beam_groups", "num_beams", "num_return_sequences",
                        "output_scores", "remove_invalid_values", "repetition_penalty", "return_dict_in_generate",
                        "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p", "typical_p"})
    t.push_back({g, N, ALL, kGeneration});
  return t;
}

bool lists(const Family& f, const char* key) {
  return std::any_of(f.keys.begin(), f.keys.end(), [&](const char* k) { return std::strcmp(k, key) == 0; });
}

// A descriptor that lists a key the table does not mark per-family, or a per-family row no family
// lists, is a mistake in the code: stop at the first use of the table.
void check_family_keys(const std::vector<HfConfigKey>& table) {
  for (const Family* f : families())
    for (const char* k : f->keys) {
      const auto row =
          std::find_if(table.begin(), table.end(), [&](const HfConfigKey& e) { return std::strcmp(e.key, k) == 0; });
      if (row == table.end() || !row->per_family)
        fail("internal: family ", f->model_type, " lists config.json key '", k, "', which model/hf_config_keys.cpp ",
             row == table.end() ? "does not have" : "gives every family");
    }
  for (const auto& e : table)
    if (e.per_family &&
        std::none_of(families().begin(), families().end(), [&](const Family* f) { return lists(*f, e.key); }))
      fail("internal: config.json key '", e.key, "' is per-family in model/hf_config_keys.cpp but no family lists it");
}

}  // namespace

const std::vector<HfConfigKey>& hf_config_keys() {
  static const std::vector<HfConfigKey> table = [] {
    auto t = make_table();
    check_family_keys(t);
    return t;
  }();
  return table;
}

const HfConfigKey* find_hf_config_key(const std::string& key, const std::string& model_type) {
  for (const auto& k : hf_config_keys())
    if (key == k.key && (!k.per_family || lists(family(model_type), k.key))) return &k;
  return nullptr;
}

const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> out;
    for (const Family* f : families()) out.push_back(f->model_type);
    return out;
  }();
  return types;
}

std::string hf_config_key_families(const HfConfigKey& k) {
  if (!k.per_family) return "all";
  std::string out;
  for (const Family* f : families())
    if (lists(*f, k.key)) out += (out.empty() ? "" : " ") + std::string(f->model_type);
  return out;
}

std::string hf_config_keys_markdown() {
  std::string out = "| config.json key | families | rule | what it does |\n|---|---|---|---|\n";
  for (const auto& k : hf_config_keys()) {
    out += std::string("| `") + k.key + "` | " + hf_config_key_families(k) + " | " +
           (k.use == KeyUse::Honoured ? "honoured" : "math-neutral") + " | " + k.why + " |\n";
  }
  return out;
}

}  // namespace shardlm::model
