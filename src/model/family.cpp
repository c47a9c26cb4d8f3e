// The table of model families (family.h) and what several families share: each family is one
// file of families/, listed once below in the order errors and `plan --hf-keys` name them.
#include "model/family.h"

#include <nlohmann/json.hpp>

#include "model/llama_config.h"
#include "util/error.h"

namespace shardlm::model {

// One line per family file.
const Family& llama_family();
const Family& mistral_family();
const Family& qwen2_family();
const Family& mixtral_family();
const Family& qwen2_moe_family();
const Family& qwen3_family();
const Family& qwen3_moe_family();

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> table = {&llama_family(),     &mistral_family(), &qwen2_family(),
                                                   &mixtral_family(),   &qwen2_moe_family(), &qwen3_family(),
                                                   &qwen3_moe_family()};
  return table;
}

const Family& family(const std::string& model_type) {
  for (const Family* f : families())
    if (model_type == f->model_type) return *f;
  std::string names;
  for (const Family* f : families()) names += (names.empty() ? "" : ", ") + std::string(f->model_type);
  fail("model_type \"", model_type, "\" is not a family shardlm reads (", names, ")");
}

namespace family_parts {

void export_sparse_block(const LlamaConfig& c, nlohmann::json& j) {
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["output_router_logits"] = c.output_router_logits;
}

void export_windows_off(const LlamaConfig& c, nlohmann::json& j) {
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.max_window_layers;
}

}  // namespace family_parts
}  // namespace shardlm::model
