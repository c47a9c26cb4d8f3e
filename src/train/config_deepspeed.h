// A DeepSpeed config as the ecosystem writes it (issue 24): Hugging Face's "auto" values, DeepSpeed's
// older spellings, and its optimizer and scheduler defaults, turned into shardlm's config before and
// after the key table reads it (load_train_config). What is filled in, and every DeepSpeed key
// accepted without effect, becomes a one-line notice the trainer logs; what shardlm cannot fill in
// is refused naming the key and the override to pass.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "train/config.h"

namespace shardlm::train {

// DeepSpeed's oldest ZeRO form: a boolean "zero_optimization" becomes {"stage": 1} (true, with the
// top-level allgather_size) or {"stage": 0}, with a notice. Also run before an override under
// zero_optimization, so that the override adds to stage 1 instead of replacing it.
void take_older_zero_form(nlohmann::json& root, std::vector<std::string>& notices);
// Before reading: rewrites DeepSpeed's older forms in `root` ("bfloat16" for "bf16", a boolean
// "zero_optimization", "_comment" keys) and takes out the "auto" values of DeepSpeed keys, returning
// the key paths they stood for (an older name as the key it names). An "auto" where shardlm has no
// value of its own is refused naming the key and the override to give.
std::set<std::string> take_deepspeed_forms(nlohmann::json& root, std::vector<std::string>& notices);

// After reading the keys (not the model): an optimizer.type given in the config gives its absent
// params that DeepSpeed optimizer's defaults, a Warmup* scheduler its absent warmup_max_lr DeepSpeed's,
// and the "auto" values that follow from another key (warmup_max_lr: the lr) or from Hugging Face's
// rule (warmup_num_steps: 1) are filled in.
void resolve_deepspeed_values(TrainConfig& c, const std::set<std::string>& given, const std::set<std::string>& autos);

// An error of check_relations about optimizer.master_precision "bf16" where that value came from
// bf16.bf16_master_weights_and_grads (resolve_deepspeed_values): the message names the key the config
// gave, and its fix is that key's. Any other message comes back as it is.
std::string name_bf16_masters_key(const TrainConfig& c, const std::set<std::string>& given, std::string message);

// After reading the model: HF's hidden-size formulas for "auto" bucket sizes (h = hidden_size):
// reduce_bucket_size h², stage3_prefetch_bucket_size int(0.9 h²), stage3_param_persistence_threshold 10 h.
void resolve_model_autos(TrainConfig& c, const std::set<std::string>& autos);

// The notices: each "auto" with the value it became, each DeepSpeed key accepted without effect or
// under an older name, and offload to "cpu" on a CPU run.
void add_deepspeed_notices(TrainConfig& c, const std::set<std::string>& given, const std::set<std::string>& autos);

}  // namespace shardlm::train
