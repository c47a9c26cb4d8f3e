// The training config's key table, joined from its sections (src/train/keys/: one file and one
// function per section, rows written with keys/rows.h), plus what derives from it here: the
// older-name aliases bound to their keys, the model section, and the key table as markdown.
#include "train/config_keys.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "model/hf_config_keys.h"
#include "model/llama_config.h"
#include "train/keys/sections.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + ("`" + n + "`");
  return out;
}

// Model fields as accepted back by the "model" section: config.json's keys for transformers minus the
// descriptive ones, plus shardlm's own model key, which that file leaves out (train_config.json must
// record the model that ran: a capacity of 0.5 read back as dropless before).
json model_fields_json(const model::LlamaConfig& m) {
  json j = model::to_hf_json(m);
  for (const char* k : {"architectures", "torch_dtype"}) j.erase(k);
  if (model::find_hf_config_key("moe_capacity_factor", m.model_type)) j["moe_capacity_factor"] = m.moe_capacity_factor;
  return j;
}

std::vector<ConfigKey> make_table() {
  std::vector<ConfigKey> t;
  for (const auto section : keys::kSections) {
    std::vector<ConfigKey> rows = section();
    t.insert(t.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
  }
  // An alias reads and checks as the key it names; it is written once, under that key's name.
  for (auto& k : t)
    if (k.deepspeed == DeepSpeed::Alias && !k.set)
      for (const auto& of : t)
        if (of.path == k.alias_of) {
          k.type = of.type, k.type_problem = of.type_problem, k.set = of.set, k.get = of.get, k.range = of.range;
        }

  // The model: a preset plus HF config.json fields, read by load_train_config (model/hf_config_keys.cpp).
  ConfigKey m;
  m.path = "model", m.type = "object", m.deepspeed = DeepSpeed::None;
  m.help = "a preset (" + join_names(model::preset_names()) +
           "; `llama-1b`: TinyLlama-1.1B's shape) and HF config.json keys, those of Model configs (e.g. "
           "`\"model_type\": \"qwen2\"`, `\"rope_parameters\": {...}`, `\"attention_bias\": true`), unknown ones "
           "refused; with `init` the shape comes from its config.json";
  m.default_doc = std::string("{\"preset\": \"") + kDefaultModelPreset + "\"}";
  m.type_problem = [](const json& v) -> std::string {
    return v.is_object() ? "" : "must be a JSON object, e.g. {\"preset\": \"demo\"}";
  };
  m.get = [](const TrainConfig& c) { return model_fields_json(c.model); };
  t.push_back(m);
  return t;
}

std::string trim_exponent(std::string s) {  // "5e+08" -> "5e8", "1e-05" -> "1e-5"
  const auto e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  const bool neg = !exp.empty() && exp[0] == '-';
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) exp = exp.substr(1);
  while (exp.size() > 1 && exp[0] == '0') exp = exp.substr(1);
  return mant + "e" + (neg ? "-" : "") + exp;
}

std::string escape_cell(const std::string& s) {
  std::string out;
  for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

std::string deepspeed_cell(const ConfigKey& k) {
  switch (k.deepspeed) {
    case DeepSpeed::None: return "—";
    case DeepSpeed::Same: return "same";
    case DeepSpeed::NoEffect: return "accepted, no effect";
    case DeepSpeed::Refused: return "feature missing: other values refused";
    case DeepSpeed::Alias: return "older name";
  }
  return "";
}

std::string allowed_cell(const ConfigKey& k) {
  std::string out;
  if (k.deepspeed == DeepSpeed::Refused) return "only " + k.harmless_doc;
  for (const auto& [v, what] : k.choices)
    out += (out.empty() ? "" : ", ") + ("`" + format_config_value(v) + "`") + (what.empty() ? "" : " (" + what + ")");
  if (!k.range.empty()) out += (out.empty() ? "" : "; ") + k.range.brief();
  if (k.required) out += (out.empty() ? "" : "; ") + std::string("required");
  if (!k.hint.empty() && !k.range.empty()) out += " (" + k.hint + ")";
  if (!k.applies_doc.empty() && !out.empty()) out += ", " + k.applies_doc;
  return out;
}

std::string default_cell(const ConfigKey& k) {
  if (!k.default_doc.empty()) return k.default_doc.front() == '{' ? "`" + k.default_doc + "`" : k.default_doc;
  if (!k.get) return "absent";  // refused keys: absent is off
  return "`" + format_config_value(k.get(TrainConfig{})) + "`";
}

}  // namespace

bool Range::holds(double v) const {
  if (finite && !std::isfinite(v)) return false;
  if (whole && v != std::floor(v)) return false;
  if (has_min && !(min_open ? v > min : v >= min)) return false;
  if (has_max && !(max_open ? v < max : v <= max)) return false;
  return true;
}

std::string Range::predicate() const {
  const auto num = [](double v) { return format_config_value(json(v)); };
  if (has_min && has_max)
    return "must lie in " + std::string(min_open ? "(" : "[") + num(min) + ", " + num(max) + (max_open ? ")" : "]");
  std::string s = "must be";
  if (whole) s += " a whole number" + (unit.empty() ? "" : " of " + unit);
  else if (finite) s += " a finite number";
  if (has_min) s += std::string(min_open ? " > " : " >= ") + num(min);
  return s;
}

std::string Range::brief() const {
  const auto num = [](double v) { return format_config_value(json(v)); };
  if (has_min && has_max)
    return std::string(min_open ? "(" : "[") + num(min) + ", " + num(max) + (max_open ? ")" : "]");
  std::string s = whole ? "whole" : finite ? "finite" : "";
  if (has_min) s += (s.empty() ? "" : ", ") + std::string(min_open ? "> " : ">= ") + num(min);
  return s;
}

std::string format_config_value(const json& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::fabs(d) < 1e6) return std::to_string(static_cast<int64_t>(d));  // 300, not 3e2
    char buf[40];
    for (int precision = 1; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof buf, "%.*g", precision, d);
      if (std::strtod(buf, nullptr) == d) break;
    }
    return trim_exponent(buf);
  }
  if (v.is_array()) {
    std::string out = "[";
    for (const auto& e : v) out += (out.size() > 1 ? ", " : "") + format_config_value(e);
    return out + "]";
  }
  return v.dump();
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> table = make_table();
  return table;
}

std::string config_keys_markdown() {
  std::string out = "| key | type | default | allowed | DeepSpeed | meaning |\n|---|---|---|---|---|---|\n";
  for (const auto& k : config_keys()) {
    std::string help = k.help;
    if (k.deepspeed == DeepSpeed::Alias) help = "older name of `" + k.alias_of + "`";
    out += "| `" + k.path + "` | " + k.type + " | " + escape_cell(default_cell(k)) + " | " +
           escape_cell(allowed_cell(k)) + " | " + deepspeed_cell(k) + " | " + escape_cell(help) + " |\n";
  }
  return out;
}

}  // namespace shardlm::train
