// Every training config key, declared once (issue 22): its dotted path, type, default, range or
// allowed values, one-line help, how it relates to DeepSpeed's key of that name, and the
// TrainConfig field it sets. Everything else derives from this table: load_train_config walks a
// config by it (types, unknown keys and the valid names they list), the value checks
// (config_ranges.cpp) read its ranges, defaults are the TrainConfig fields it binds, config_to_json
// writes its keys, and `shardlm config-keys --markdown` prints it as the README's key table
// (tests/integration/test_readme.py fails when the two differ). Adding a key is one row in
// the section's file of src/train/keys/ plus the field it sets and the code that uses it.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "train/config.h"

namespace shardlm::train {

// The model preset of a config whose model section names none.
inline constexpr const char* kDefaultModelPreset = "demo";

// How a key relates to the DeepSpeed config key of the same name.
enum class DeepSpeed {
  None,      // shardlm's own key
  Same,      // DeepSpeed's key, with DeepSpeed's meaning
  NoEffect,  // DeepSpeed's key, accepted with its meaning, changes nothing in shardlm (help says why)
  Refused,   // DeepSpeed's key for a feature shardlm lacks: accepted only with a harmless value
  Alias,     // DeepSpeed's older name of another key (alias_of), read into the same field
};

// Bounds of a numeric key (of each element of a list key). Empty: no bounds.
struct Range {
  bool has_min = false, min_open = false;
  double min = 0;
  bool has_max = false, max_open = false;
  double max = 0;
  bool whole = false;   // a whole number (a number-typed count of elements)
  bool finite = false;  // refuses inf
  std::string unit;     // what a whole number counts ("elements")
  bool empty() const { return !has_min && !has_max && !whole && !finite; }
  bool holds(double v) const;
  std::string predicate() const;  // "must be >= 0", "must lie in [0, 1)", "must be a whole number of elements >= 0"
  std::string brief() const;      // the README's form: ">= 0", "[0, 1)", "whole, >= 0"
};

struct ConfigKey {
  std::string path;  // dotted: "optimizer.params.lr"
  std::string type;  // "integer", "number", "bool", "string", "list of integers", ...
  std::string help;  // one line
  DeepSpeed deepspeed = DeepSpeed::None;
  std::string alias_of;  // DeepSpeed::Alias: the key whose field this name also sets

  // Value checks (config_ranges.cpp), after the whole config is read; each error names the key,
  // the rule and the value.
  Range range;
  std::string hint;  // in parentheses after the rule: "0 disables clipping"
  std::string fix;   // after the value: "to skip validation set data.val to \"\""
  std::vector<std::pair<nlohmann::json, std::string>> choices;  // allowed values, with what each means
  bool required = false;  // must be given (non-empty); the error ends with `fix`
  std::function<bool(const TrainConfig&)> applies;  // checked only when this holds (null: always)
  std::string applies_doc;                          // when: "with fp16.enabled"
  bool optional = false;  // absent means "not set": checked only when given

  // DeepSpeed::Refused: the values that turn the feature off, and the refusal's reason and fix.
  std::function<bool(const nlohmann::json&)> harmless;
  std::string harmless_doc, why;

  // The binding to TrainConfig. type_problem: "" when a JSON value has the key's type, else what it
  // must be (config_types.h). set: stores a value of that type (throws Error for one it refuses).
  // get: the field as JSON (the default is get of a default TrainConfig, unless default_doc).
  // Null set: the key is read by load_train_config itself (model); null get: nothing to write.
  std::function<std::string(const nlohmann::json&)> type_problem;
  std::function<void(TrainConfig&, const nlohmann::json&)> set;
  std::function<nlohmann::json(const TrainConfig&)> get;
  std::function<bool(const TrainConfig&)> written;  // in train_config.json only when this holds (null: always)
  std::function<nlohmann::json(const TrainConfig&)> write;  // what train_config.json holds (null: get)
  std::string default_doc;                          // the README's default where get is not it
};

// Every key, in the order a section's valid names are listed: a section comes where its first key is.
const std::vector<ConfigKey>& config_keys();

// The README's key table: | key | type | default | allowed | DeepSpeed | meaning |.
std::string config_keys_markdown();

// A value as the README and the error messages print it: 3e-4 as 0.0003, 5e8 as 5e8, strings quoted.
std::string format_config_value(const nlohmann::json& v);

}  // namespace shardlm::train
