// See hf_rope.h: RoPE parameters as config.json holds them, read and written back.
#include "model/hf_rope.h"

#include <map>
#include <set>

#include "util/error.h"

namespace shardlm::model {
namespace {

using nlohmann::json;

bool is_rope_type(const std::string& t) {
  for (const char* k : {"default", "linear", "dynamic", "yarn", "longrope", "llama3"})
    if (t == k) return true;
  return false;
}

// The keys of a rope_parameters / rope_scaling dict each type reads (transformers' _validate_*
// functions: required and optional keys). Anything else in the dict is refused, since transformers
// would ignore it with only a warning.
const std::map<std::string, std::set<std::string>>& rope_keys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor"}},
      {"yarn", {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
                "mscale_all_dim", "truncate"}},
      {"longrope", {"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor"}},
      {"llama3", {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}},
  };
  return keys;
}


// The keys rope type `type` reads, for its error message ("factor, original_max_position_embeddings").
std::string reads_of(const std::string& type) {
  std::string out;
  for (const auto& k : rope_keys().at(type)) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "rope_theta only" : out;
}

}  // namespace

bool uses_original_length(const std::string& t) { return t == "yarn" || t == "longrope" || t == "llama3"; }

// One RoPE dict (rope_parameters, or 4.x's rope_scaling with `type` as the old name of rope_type).
RopeParameters parse_rope_dict(const json& d, const std::string& key, double fallback_theta, const std::string& where) {
  if (!d.is_object()) fail(where, ": ", key, " must be a JSON object or null, got ", d.dump());
  RopeParameters r;
  if (d.contains("rope_type") && !d["rope_type"].is_null()) {
    if (!d["rope_type"].is_string()) fail(where, ": ", key, ".rope_type must be a string, got ", d["rope_type"].dump());
    r.type = d["rope_type"].get<std::string>();
  } else if (d.contains("type") && !d["type"].is_null()) {
    if (!d["type"].is_string()) fail(where, ": ", key, ".type must be a string, got ", d["type"].dump());
    r.type = d["type"].get<std::string>();
  }
  if (!is_rope_type(r.type))
    fail(where, ": ", key, " has rope type \"", r.type,
         "\", which shardlm does not implement; supported: default, linear, dynamic, yarn, longrope, llama3");
  r.theta = fallback_theta;
  const auto& allowed = rope_keys().at(r.type);
  auto num = [&](const std::string& k) {
    if (!d[k].is_number()) fail(where, ": ", key, ".", k, " must be a number, got ", d[k].dump());
    return d[k].get<double>();
  };
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string& k = it.key();
    if (k == "rope_type" || k == "type") continue;
    if (k == "truncate" && it->is_null()) {  // transformers reads it with get("truncate", True): null is false
      r.truncate = false;
      continue;
    }
    if (it->is_null()) continue;  // transformers treats an explicit null as absent
    if (k == "rope_theta") {
      r.theta = num(k);
    } else if (k == "partial_rotary_factor") {
      if (num(k) != 1.0)
        fail(where, ": ", key, ".partial_rotary_factor ", it->dump(),
             ": partial rotary embeddings are not supported (only 1.0)");
    } else if (!allowed.count(k)) {
      fail(where, ": ", key, ".", k, " = ", it->dump(), " is not a parameter of rope type \"", r.type,
           "\" (transformers would ignore it with a warning); remove it, or fix the rope type. \"", r.type,
           "\" reads: ", reads_of(r.type));
    } else if (k == "original_max_position_embeddings") {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0)
        fail(where, ": ", key, ".original_max_position_embeddings must be a positive integer, got ", it->dump());
      r.original_max_position_embeddings = it->get<int64_t>();
    } else if (k == "truncate") {
      if (!it->is_boolean()) fail(where, ": ", key, ".truncate must be true or false, got ", it->dump());
      r.truncate = it->get<bool>();
    } else if (k == "short_factor" || k == "long_factor") {
      if (!it->is_array()) fail(where, ": ", key, ".", k, " must be a list of numbers, got ", it->dump());
      auto& dst = k == "short_factor" ? r.short_factor : r.long_factor;
      for (const auto& x : *it) {
        if (!x.is_number()) fail(where, ": ", key, ".", k, " must be a list of numbers, got ", it->dump());
        dst.push_back(x.get<double>());
      }
    } else {
      const double v = num(k);
      if (k == "factor") r.factor = v;
      else if (k == "attention_factor") r.attention_factor = v;
      else if (k == "beta_fast") r.beta_fast = v;
      else if (k == "beta_slow") r.beta_slow = v;
      else if (k == "mscale") r.mscale = v;
      else if (k == "mscale_all_dim") r.mscale_all_dim = v;
      else if (k == "low_freq_factor") r.low_freq_factor = v;
      else if (k == "high_freq_factor") r.high_freq_factor = v;
    }
  }
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail(where, ": rope type \"", r.type, "\" needs ", what, " in ", key);
  };
  if (r.type == "linear" || r.type == "dynamic" || r.type == "yarn" || r.type == "llama3") need(r.factor.has_value(), "factor");
  if (r.type == "llama3") need(r.low_freq_factor && r.high_freq_factor, "low_freq_factor and high_freq_factor");
  if (r.type == "longrope") need(!r.short_factor.empty() && !r.long_factor.empty(), "short_factor and long_factor");
  return r;
}

json rope_dict(const RopeParameters& r, bool with_theta) {
  json d = {{"rope_type", r.type}};
  if (with_theta) d["rope_theta"] = r.theta;
  if (r.factor) d["factor"] = *r.factor;
  if (r.original_max_position_embeddings) d["original_max_position_embeddings"] = *r.original_max_position_embeddings;
  if (r.attention_factor) d["attention_factor"] = *r.attention_factor;
  if (r.beta_fast) d["beta_fast"] = *r.beta_fast;
  if (r.beta_slow) d["beta_slow"] = *r.beta_slow;
  if (r.mscale) d["mscale"] = *r.mscale;
  if (r.mscale_all_dim) d["mscale_all_dim"] = *r.mscale_all_dim;
  if (r.truncate) d["truncate"] = *r.truncate;
  if (!r.short_factor.empty()) d["short_factor"] = r.short_factor;
  if (!r.long_factor.empty()) d["long_factor"] = r.long_factor;
  if (r.low_freq_factor) d["low_freq_factor"] = *r.low_freq_factor;
  if (r.high_freq_factor) d["high_freq_factor"] = *r.high_freq_factor;
  return d;
}

}  // namespace shardlm::model
