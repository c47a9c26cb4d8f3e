// Reads a training config: the JSON file, then `--section.key=value` overrides, walked by the key
// table (config_keys.h) that gives every key's type, field and checks; what relates keys to each
// other and the model section are read here.
#include "train/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/attention.h"
#include "parallel/context/context_parallel.h"
#include "train/config_deepspeed.h"
#include "train/config_keys.h"
#include "train/config_ranges.h"
#include "util/error.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

// The key table as nested JSON objects: a section's entries are its keys and sub-sections, each
// where its first key comes in the table (the order unknown-key errors list them in).
struct SectionNode {
  std::vector<std::pair<std::string, const ConfigKey*>> entries;  // name, row (null: the sub-section)
  std::map<std::string, SectionNode> sections;
};

const SectionNode& key_tree() {
  static const SectionNode root = [] {
    SectionNode r;
    for (const auto& k : config_keys()) {
      SectionNode* node = &r;
      size_t start = 0;
      for (size_t dot; (dot = k.path.find('.', start)) != std::string::npos; start = dot + 1) {
        const std::string part = k.path.substr(start, dot - start);
        if (!node->sections.count(part)) node->entries.emplace_back(part, nullptr);
        node = &node->sections[part];
      }
      node->entries.emplace_back(k.path.substr(start), &k);
    }
    return r;
  }();
  return root;
}

bool has(const json& j, const std::string& key) { return j.contains(key) && !j.at(key).is_null(); }

// Edit distance of two keys, letters compared without case and '-' read as '_'.
size_t key_distance(const std::string& a, const std::string& b) {
  auto fold = [](char ch) { return ch == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); };
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (fold(a[i - 1]) == fold(b[j - 1]) ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The section's key that `key` is most likely a misspelling of (at most 2 edits, fewer for short
// keys), or "".
std::string near_miss(const std::string& key, const SectionNode& node) {
  const size_t most = key.size() <= 4 ? 0 : key.size() <= 8 ? 1 : 2;
  std::string best;
  size_t best_d = most + 1;
  for (const auto& entry : node.entries) {
    const size_t d = key_distance(key, entry.first);
    if (d < best_d) best_d = d, best = entry.first;
  }
  return best;
}

// Reads the JSON object `j` (the section `where`; "config" at the top) into `c`: type-checks and
// stores each key its rows name, refuses the harmful values of refused DeepSpeed keys, then refuses
// keys no row names, listing the valid ones. `given` collects the dotted paths present.
void read_section(const SectionNode& node, const json& j, const std::string& where, TrainConfig& c,
                  std::set<std::string>& given) {
  if (!j.is_object()) fail(where, " must be a JSON object, got ", j.dump());
  const std::string sep = where == "config" ? " key " : ".";  // "config key steps", "data.seq_len"
  for (const auto& [name, key] : node.entries) {
    if (!has(j, name)) continue;
    const json& v = j.at(name);
    if (!key) {
      read_section(node.sections.at(name), v, where == "config" ? name : where + "." + name, c, given);
      continue;
    }
    given.insert(key->path);
    if (key->deepspeed == DeepSpeed::Alias) given.insert(key->alias_of);  // relations see the key it names
    if (key->harmless) {
      if (!key->harmless(v)) fail(where, sep, name, " = ", v.dump(), ": ", key->why);
      continue;
    }
    // JSON's numbers carry no type, and nlohmann's get<int64_t>(2.5) truncates: an integer key must
    // hold an integral value, an unsigned one a non-negative one (config_types.h).
    const std::string problem = key->type_problem ? key->type_problem(v) : "";
    if (!problem.empty()) fail(where, sep, name, ": ", problem, ", got ", v.dump());
    if (!key->set) continue;
    try {
      key->set(c, v);
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {
      fail(where, sep, name, ": wrong type, got ", v.dump());
    }
  }
  std::string valid;
  for (const auto& entry : node.entries) valid += (valid.empty() ? "" : ", ") + entry.first;
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const auto& entry : node.entries) known = known || entry.first == it.key();
    if (known) continue;
    // DeepSpeed reads its top level key by key and ignores the rest (cuda_visible_devices,
    // comms_config, ...): such a key is accepted naming it, unless it looks like a misspelt key.
    // Every key DeepSpeed 0.19.8 reads has a row (tests/data/deepspeed/KEYS.md, checked by
    // test_deepspeed_keys.cpp), so a key without one is a key DeepSpeed ignores too.
    const std::string near = where == "config" ? near_miss(it.key(), node) : "";
    if (where == "config" && near.empty()) {
      c.notices.push_back(it.key() + ": not a key DeepSpeed 0.19.8 reads (it ignores it) nor one of shardlm's; ignored");
      continue;
    }
    fail("unknown config key '", where == "config" ? "" : where + ".", it.key(), "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)", ". Valid keys", where == "config" ? "" : " in " + where,
         ": ", valid);
  }
}

void apply_override(json& root, const std::string& ov, std::vector<std::string>& notices) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("override '", ov, "' must look like --section.key=value (e.g. --optimizer.params.lr=3e-4)");
  const std::string path = ov.substr(0, eq), text = ov.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const std::exception&) {
    value = text;  // a bare string such as a file path
  }
  json* node = &root;
  size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) fail("override '", ov, "' has an empty key");
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    // DeepSpeed's older `"zero_optimization": true` is a section, stage 1, under a key overridden below it.
    if (node == &root && key == "zero_optimization") take_older_zero_form(root, notices);
    if (node->contains(key) && !(*node)[key].is_object() && !(*node)[key].is_null())
      fail("override '", ov, "': ", path.substr(0, dot), " is ", (*node)[key].dump(), " in the config, not a section; "
           "override it as a whole (--", path.substr(0, dot), "=VALUE)");
    if (!node->contains(key) || !(*node)[key].is_object()) (*node)[key] = json::object();
    node = &(*node)[key];
    start = dot + 1;
  }
}

// The model: a preset plus HF config.json fields; with `init`, the init directory's config.json
// (explicit fields next to it must agree with that file).
void read_model(TrainConfig& c, const json& model_fields) {
  json fields = model_fields;
  fields.erase("preset");
  if (!c.init.empty()) {
    // Both define the model. init wins, as it always has (configs/*.json carry a preset and are the
    // usual base of an `--init=DIR` run), but never without a word: the notice names the preset dropped.
    if (model_fields.contains("preset"))
      c.notices.push_back("model.preset " + model_fields["preset"].dump() + ": not used; with init \"" + c.init +
                          "\" the model comes from " + c.init + "/config.json (remove model.preset to silence this)");
    const model::LlamaConfig from_file = model::read_hf_config(c.init + "/config.json");
    c.model = from_file;
    c.model_preset = "init:" + c.init;
    // Fields beside init may only repeat config.json's shape, or set what config.json does not hold
    // (moe_capacity_factor, shardlm's own): they apply to the model itself.
    model::apply_hf_fields(c.model, fields, "model");
    if (model::to_hf_json(c.model) != model::to_hf_json(from_file))
      fail("model fields ", fields.dump(), " contradict ", c.init, "/config.json; with `init` the model shape comes "
           "from that file, so remove them from the model section");
  } else {
    if (model_fields.contains("preset") && !model_fields["preset"].is_string())
      fail("model.preset must be a string, one of the presets");
    const std::string preset = model_fields.value("preset", std::string(kDefaultModelPreset));
    c.model = model::preset(preset);
    model::apply_hf_fields(c.model, fields, "model");
    c.model.validate();
    // The record names what was trained: the preset alone, or the family and the preset it started
    // from ("mixtral (demo preset + 16 model fields)"), which no longer names a preset.
    c.model_preset = fields.empty() ? preset
                                    : c.model.model_type + " (" + preset + " preset + " + std::to_string(fields.size()) +
                                          " model field" + (fields.size() == 1 ? "" : "s") + ")";
  }
  for (const auto& n : c.model.notices) c.notices.push_back((c.init.empty() ? "model" : c.init + "/config.json") + ": " + n);
}

}  // namespace

void TrainConfig::validate_for(int world_size) const {
  const int model_split = parallelism.tensor_parallel * parallelism.pipeline_parallel;
  if (world_size % model_split != 0)
    fail("the job has ", world_size, " rank(s), which tensor_parallel x pipeline_parallel = ",
         parallelism.tensor_parallel, " x ", parallelism.pipeline_parallel, " = ", model_split,
         " does not divide; launch a multiple of ", model_split, " ranks (--nproc) or change parallelism");
  const int cp = parallelism.context_parallel;
  if (cp > 1 && (world_size / model_split) % cp != 0)
    fail("parallelism.context_parallel = ", cp, " does not divide the ", world_size / model_split,
         " ranks beside tensor_parallel x pipeline_parallel; launch a multiple of ", model_split * cp,
         " ranks (--nproc) or change context_parallel");
  parallel::context::check_context_parallel(model, cp, parallel::context::parse_mode(parallelism.context_parallel_mode),
                                            data.seq_len, parallelism.tensor_parallel);
  const int dp_size = world_size / model_split / cp;  // the data-parallel ranks: context-parallel ones share data
  const int shard = zero.mics_shard_size > 0 ? zero.mics_shard_size : parallelism.hybrid_shard ? parallelism.shard_group_size : 0;
  const int zero_ranks = dp_size * cp;  // ZeRO shards over dp x cp (parallel_dims.h)
  if (shard > 0 && zero_ranks % shard != 0)
    fail("hybrid sharding: a shard group of ", shard, " data-parallel ranks does not divide the ", zero_ranks,
         cp > 1 ? " data-parallel x context-parallel" : " data-parallel", " ranks of this job; set ",
         zero.mics_shard_size > 0 ? "zero_optimization.mics_shard_size" : "parallelism.shard_group_size",
         " to a divisor of ", zero_ranks, ", or launch a multiple of ", shard * model_split, " ranks");
  if (train_batch_size > 0 && (micro_batch == 0 || grad_accum == 0))
    fail("the batch keys left out next to train_batch_size are not derived yet (TrainConfig::resolve_for)");
  if (micro_batch < 1) fail("train_micro_batch_size_per_gpu must be >= 1, got ", micro_batch);
  if (grad_accum < 1) fail("gradient_accumulation_steps must be >= 1, got ", grad_accum);
  const int64_t product = micro_batch * grad_accum * dp_size;
  if (train_batch_size != 0 && train_batch_size != product)
    fail("inconsistent batch sizes: train_batch_size = ", train_batch_size,
         " but train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel ranks = ", micro_batch,
         " x ", grad_accum, " x ", dp_size, " = ", product,
         ". Fix one of them, or drop train_batch_size to let it follow.");
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  json root = json::object();
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) fail("cannot open config file '", path, "'");
    try {
      in >> root;
    } catch (const std::exception& e) {
      fail("config file '", path, "' is not valid JSON: ", e.what());
    }
    if (!root.is_object())
      fail("config file '", path, "' must be a JSON object ({\"train_batch_size\": ..., ...}), got a JSON ",
           root.type_name());
  }
  TrainConfig c;
  for (const auto& ov : overrides) apply_override(root, ov, c.notices);

  // DeepSpeed's older forms and Hugging Face's "auto" values (config_deepspeed.h): an "auto" is taken
  // out here, so the key reads as absent, and filled in from shardlm's value below.
  const std::set<std::string> autos = take_deepspeed_forms(root, c.notices);
  std::set<std::string> given;
  read_section(key_tree(), root, "config", c, given);
  resolve_deepspeed_values(c, given, autos);
  check_key_values(c, given);
  // Given train_batch_size, a batch key left out is derived by resolve_for (DeepSpeed's rule).
  if (given.count("train_batch_size")) {
    if (!given.count("train_micro_batch_size_per_gpu")) c.micro_batch = 0;
    if (!given.count("gradient_accumulation_steps")) c.grad_accum = 0;
  }
  read_model(c, has(root, "model") ? root.at("model") : json::object());
  resolve_model_autos(c, autos);
  try {
    check_relations(c, given);
  } catch (const Error& e) {
    throw Error(name_bf16_masters_key(c, given, e.what()));
  }
  add_deepspeed_notices(c, given, autos);
  return c;
}

// A whole number held as a double (bucket sizes, thresholds: DeepSpeed's int-typed keys) is written
// as an integer: DeepSpeed's pydantic models refuse 9.223372036854776e+18 for an int. Values at or
// past 2^63 are written as sys.maxsize, the unbounded default they stand for.
namespace {
json integral_as_integer(const json& v) {
  if (!v.is_number_float()) return v;
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d)) return v;
  if (d >= 9.223372036854775807e18) return json(std::numeric_limits<int64_t>::max());
  if (d <= -9.223372036854775807e18) return v;
  return json(static_cast<int64_t>(d));
}
}  // namespace

// Every row the table writes, at its dotted path (refused keys and older names are not written).
std::string config_to_json(const TrainConfig& c) {
  json j = json::object();
  for (const auto& k : config_keys()) {
    if (!k.get || k.deepspeed == DeepSpeed::Alias || (k.written && !k.written(c))) continue;
    json* node = &j;
    size_t start = 0;
    for (size_t dot; (dot = k.path.find('.', start)) != std::string::npos; start = dot + 1)
      node = &(*node)[k.path.substr(start, dot - start)];
    (*node)[k.path.substr(start)] = integral_as_integer(k.write ? k.write(c) : k.get(c));
  }
  return j.dump(2);
}

precision::Policy precision_of(const TrainConfig& cfg) {
  return precision::policy_for(cfg.bf16, cfg.fp16.enabled, cfg.float64_for_tests);
}

model::Attention attention_for(const TrainConfig& cfg) {
  return model::resolve_attention(cfg.attn_implementation, cfg.device == "cuda", precision_of(cfg).compute);
}

}  // namespace shardlm::train
