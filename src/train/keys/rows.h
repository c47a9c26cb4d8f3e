// The builders that the config sections' rows are written with (src/train/keys/<section>.cpp;
// config_keys.h says what derives from the rows). key(...) binds a TrainConfig field through
// FIELD(...), custom(...) a key whose JSON form is not one field's, alias(...)/older_section(...)
// an older DeepSpeed name, refused(...)/only(...)/refused_section(...) a DeepSpeed feature shardlm
// lacks, noted(...)/noted_section(...) a DeepSpeed key that changes nothing; then the row's checks
// (.at_least(0), .choice("a", "what a means"), .only_if(...), ...).
// Every callable a row takes is a plain function pointer (a lambda without captures converts to
// one), so a row costs the compiler one small function instead of a std::function instantiation per
// callable: the old one-function table of such temporaries took GCC 340 s at -O2 (issue 40).
#pragma once
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "train/config.h"
#include "train/config_keys.h"
#include "train/config_types.h"

namespace shardlm::train::keys {
using json = nlohmann::json;

using ConfigTest = bool (*)(const TrainConfig&);          // only_if, written_if
using ValueTest = bool (*)(const json&);                  // refused: the harmless values
using TypeProblem = std::string (*)(const json&);         // "" when a value has the key's type
using Setter = void (*)(TrainConfig&, const json&);       // stores a value
using Getter = json (*)(const TrainConfig&);              // reads the field back as JSON
template <typename T>
using FieldRef = T& (*)(TrainConfig&);                     // what FIELD(...) makes

// How a key relates to DeepSpeed's key of the same name, as rows spell it.
inline constexpr DeepSpeed D = DeepSpeed::Same, OWN = DeepSpeed::None, NOEFFECT = DeepSpeed::NoEffect;

template <typename T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) return "integer >= 0";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (is_vector<T>::value) return "list of " + type_name<typename T::value_type>() + "s";
  else return "value";
}

// written_if(takes("warmup_min_lr")): written to train_config.json when the run's scheduler takes it.
struct Takes {
  std::string param;
};
Takes takes(std::string param);

// A row under construction: key(...) or refused(...), then its checks and notes.
class Row {
 public:
  explicit Row(ConfigKey k) : k_(std::move(k)) {}
  Row& at_least(double v) { return bound_min(v, false); }
  Row& above(double v) { return bound_min(v, true); }
  Row& within(double lo, double hi);        // [lo, hi]
  Row& within_below(double lo, double hi);  // [lo, hi)
  Row& whole(std::string unit);
  Row& finite() { k_.range.finite = true; return *this; }
  Row& hint(std::string h) { k_.hint = std::move(h); return *this; }
  Row& fix(std::string f) { k_.fix = std::move(f); return *this; }
  Row& choice(json v, std::string what = "");
  Row& required(std::string fix);
  Row& only_if(ConfigTest when, std::string doc);
  Row& optional(std::string default_doc);
  Row& written_as(Getter write);
  Row& written_if(ConfigTest when);
  Row& written_if(const Takes& takes);
  // Refuses one value of the key's type with `why` (a DeepSpeed value shardlm has not built).
  Row& refusing(json value, std::string why);
  operator ConfigKey() const { return k_; }  // NOLINT: rows convert implicitly into the table

 private:
  Row& bound_min(double v, bool open);
  ConfigKey k_;
};

// FIELD(data.seq_len): the TrainConfig field a row reads and sets.
#define FIELD(member) +[](TrainConfig& c) -> auto& { return c.member; }

ConfigKey row_base(DeepSpeed ds, std::string path, std::string type, std::string help);

// A key bound to one TrainConfig field: the field's type is the key's JSON type, its initializer
// in config.h the key's default.
template <typename T>
Row key(DeepSpeed ds, std::string path, FieldRef<T> ref, std::string help) {
  static_assert(!std::is_const_v<T>);
  ConfigKey k = row_base(ds, std::move(path), type_name<T>(), std::move(help));
  k.type_problem = &json_type_problem<T>;
  k.set = [ref](TrainConfig& c, const json& v) { ref(c) = v.get<T>(); };
  // Reads through the same accessor; nothing is written through the reference.
  k.get = [ref](const TrainConfig& c) { return json(ref(const_cast<TrainConfig&>(c))); };
  return Row(std::move(k));
}

// A key whose JSON type, field and writing are not one field's (optimizer.params.betas, device_memory).
Row custom(DeepSpeed ds, std::string path, std::string type, std::string help, TypeProblem type_problem,
           Setter set, Getter get);

// DeepSpeed's older name of the key at `of`, read into the same field (bound by config_keys()).
Row alias(std::string path, std::string of);

// A DeepSpeed key for a feature shardlm lacks: accepted while harmless(value), else refused with `why`.
Row refused(std::string path, std::string type, ValueTest harmless, std::string harmless_doc, std::string help,
            std::string why);
// A DeepSpeed key whose value must be `supported` (shardlm implements only that behaviour).
Row only(std::string path, const json& supported, std::string help, std::string why);

void ignore_value(TrainConfig&, const json&);

// A DeepSpeed key that changes nothing shardlm computes and sets no field: type-checked, then
// accepted with a one-line notice (load_train_config) saying why it has no effect.
template <typename T>
Row noted(std::string path, std::string help) {
  ConfigKey k = row_base(DeepSpeed::NoEffect, std::move(path), type_name<T>(), std::move(help));
  k.type_problem = &json_type_problem<T>;
  k.set = &ignore_value;
  return Row(std::move(k));
}

// A DeepSpeed section read as one unit that changes nothing shardlm computes (its keys are
// DeepSpeed's, a JSON object of any of them): accepted with a one-line notice.
Row noted_section(std::string path, std::string help);

// DeepSpeed's older name of a whole section ("bfloat16" for "bf16"): take_deepspeed_forms
// (config_deepspeed.cpp) reads it as that section before the table is walked.
Row older_section(std::string path, std::string of);

// A DeepSpeed section for a feature that changes the arithmetic and that shardlm lacks: accepted
// only switched off ({"enabled": false}), else refused with `why`.
Row refused_section(std::string path, std::string help, std::string why, bool can_disable = true);

// DeepSpeed's deprecated boolean spelling of an offload (zero_optimization.cpu_offload: true is
// offload_optimizer {"device": "cpu"}), read into the device of the section that replaced it.
Row offload_flag(std::string path, std::string of, FieldRef<std::string> device);

// Helpers that several sections' rows share.
bool is_false(const json& v);
std::string lower(std::string s);

}  // namespace shardlm::train::keys
