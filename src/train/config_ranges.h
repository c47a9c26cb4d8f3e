// Value checks of a config read by load_train_config (issue 11): each names the key, the value and
// the valid range, so a typo'd number fails at start-up, not as a NaN hours later. The per-key rules
// are the rows of the key table (src/train/keys/); the rules that relate keys to each other are code here.
#pragma once
#include <set>
#include <string>

#include "train/config.h"

namespace shardlm::train {

// Every key's range, allowed values and required-ness (config_keys.h); `given` holds the dotted
// paths the config gave (a key marked optional is checked only when given).
void check_key_values(const TrainConfig& c, const std::set<std::string>& given);

// The checks that relate keys to each other and to the model (run once the model is built);
// `given` as for check_key_values (a DeepSpeed optimizer or scheduler param given to a type that
// takes no such param is refused, as DeepSpeed's constructor call refuses it).
void check_relations(const TrainConfig& c, const std::set<std::string>& given);

// Whether DeepSpeed's scheduler `type` takes scheduler.params.`param` (its constructor's arguments;
// shardlm's "constant" takes none).
bool scheduler_takes(const std::string& type, const std::string& param);

}  // namespace shardlm::train
