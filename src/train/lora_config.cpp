// See lora_config.h. PEFT 0.22.0's LoraConfig is the reference for every key and default here.
#include "train/lora_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "io/safetensors.h"
#include "util/error.h"

namespace shardlm::train {
namespace {

using json = nlohmann::json;

// LoraConfig().to_dict() of peft 0.22.0 for the keys shardlm does not implement: accepted at these
// values (null, false, {} or [] count as one "unset"), refused by name otherwise.
const json& peft_unimplemented_defaults() {
  static const json d = {
      {"auto_mapping", nullptr}, {"revision", nullptr}, {"inference_mode", false}, {"exclude_modules", nullptr},
      {"fan_in_fan_out", false}, {"layers_pattern", nullptr}, {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"}, {"trainable_token_indices", nullptr}, {"loftq_config", json::object()},
      {"eva_config", nullptr}, {"corda_config", nullptr}, {"astra_config", nullptr}, {"lora_ga_config", nullptr},
      {"velora_config", nullptr}, {"alora_invocation_tokens", nullptr}, {"use_qalora", false},
      {"qalora_group_size", 16}, {"monteclora_config", nullptr}, {"layer_replication", nullptr},
      {"lora_bias", false}, {"use_bdlora", nullptr}, {"arrow_config", nullptr},
      {"kasa_config", nullptr}, {"ensure_weight_tying", false}};
  return d;
}
// Keys that describe the file, not the arithmetic.
const std::set<std::string> kMetadata = {"peft_version", "base_model_name_or_path", "task_type", "peft_type",
                                         "inference_mode", "revision", "auto_mapping", "megatron_core",
                                         "qalora_group_size"};

bool unset(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_object() || v.is_array()) && v.empty());
}

}  // namespace

void read_peft_adapter_config(const json& j, const std::string& where, LoraConfig& lora) {
  if (!j.is_object()) fail(where, ": an adapter_config.json must be a JSON object");
  if (j.contains("peft_type") && j["peft_type"] != "LORA")
    fail(where, ": peft_type is ", j["peft_type"].dump(), "; shardlm reads LoRA adapters only (peft_type \"LORA\")");
  if (j.contains("layers_pattern") && !unset(j["layers_pattern"]) && j["layers_pattern"] != "layers" &&
      j["layers_pattern"] != json::array({"layers"}))
    fail(where, ": layers_pattern ", j["layers_pattern"].dump(), " is not supported (a Llama's layers are \"layers\")");
  auto& o = lora.peft;
  for (const auto& [k, v] : j.items()) {
    const auto bad = [&](const std::string& what) {
      fail(where, ": ", k, " = ", v.dump(), " ", what);
    };
    try {
      if (k == "r") o.r = v.get<int64_t>();
      else if (k == "lora_alpha") o.lora_alpha = v.get<double>();
      else if (k == "lora_dropout") o.lora_dropout = v.get<double>();
      else if (k == "use_rslora") o.use_rslora = v.get<bool>();
      else if (k == "bias") { if (v != "none") bad("is not supported; only \"none\" (no bias trains)"); }
      else if (k == "use_dora") { if (!unset(v)) bad("is not supported: DoRA is not implemented"); }
      else if (k == "target_modules") {
        o.target_modules.clear(), o.target_regex.clear();
        if (v.is_string()) o.target_regex = v.get<std::string>();
        else if (v.is_array()) o.target_modules = v.get<std::vector<std::string>>();
      } else if (k == "target_parameters") {
        if (!v.is_null() && !v.is_array()) bad("must be a list of parameter names (PEFT refuses a string)");
        o.target_parameters = v.is_null() ? std::vector<std::string>{} : v.get<std::vector<std::string>>();
      } else if (k == "init_lora_weights") {
        if (v.is_boolean()) o.init_lora_weights = v.get<bool>() ? "true" : "false";
        else if (v == "gaussian") o.init_lora_weights = "gaussian";
        else bad("is not supported; true, false or \"gaussian\"");
      } else if (k == "modules_to_save") o.modules_to_save = v.is_null() ? std::vector<std::string>{} : v.get<std::vector<std::string>>();
      else if (k == "layers_to_transform") {
        o.layers_to_transform.clear();
        if (v.is_number_integer()) o.layers_to_transform = {v.get<int64_t>()};
        else if (v.is_array()) o.layers_to_transform = v.get<std::vector<int64_t>>();
      } else if (k == "rank_pattern") o.rank_pattern = v.get<std::map<std::string, int64_t>>();
      else if (k == "alpha_pattern") o.alpha_pattern = v.get<std::map<std::string, double>>();
      else if (kMetadata.count(k) || k == "layers_pattern") continue;
      else if (!unset(v) && (!peft_unimplemented_defaults().contains(k) || v != peft_unimplemented_defaults()[k]))
        bad("is not implemented by shardlm; remove the key or set it to PEFT's default" +
            (peft_unimplemented_defaults().contains(k) ? " (" + peft_unimplemented_defaults()[k].dump() + ")" : std::string()));
    } catch (const json::exception&) {
      bad("has the wrong type for PEFT's LoraConfig");
    }
  }
}

model::LoraOptions lora_options(const LoraConfig& lora) {
  std::string path = lora.config;
  if (path.empty() && !lora.init_from.empty()) path = lora.init_from + "/adapter_config.json";
  if (path.empty()) return lora.peft;
  std::ifstream in(path);
  if (!in) fail("lora.config: cannot read ", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("lora.config: ", path, " is not JSON (", e.what(), ")");
  }
  LoraConfig read;
  read_peft_adapter_config(j, path, read);
  return read.peft;
}

void apply_lora(model::Llama& model, const LoraConfig& lora, uint64_t seed) {
  model.apply_lora(model::resolve_lora(lora_options(lora), model.config()), seed);
  if (lora.init_from.empty()) return;
  const auto file = lora.init_from + "/adapter_model.safetensors";
  auto tensors = io::load_safetensors(file);
  const std::string prefix = "base_model.model.";
  for (auto& [name, t] : tensors) {
    if (name.rfind(prefix, 0) != 0) fail("lora.init_from: ", file, " holds ", name, ", not a PEFT adapter tensor (", prefix, "...)");
    name = name.substr(prefix.size());
  }
  model.load(tensors, file);
}

std::vector<std::pair<std::string, at::Tensor>> peft_adapter_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : named) out.emplace_back("base_model.model." + name, t);
  return out;
}

json peft_adapter_config(const model::Llama& model, const std::string& base) {
  const auto& plan = model.lora_plan();
  json j = peft_unimplemented_defaults();
  std::set<std::string> modules;
  std::set<int64_t> layers;
  json rank_pattern = json::object(), alpha_pattern = json::object();
  const auto& first = plan.targets.at(0);
  for (const auto& t : plan.targets) {
    modules.insert(t.module.substr(t.module.find('.') + 1));
    const auto key = "model.layers." + std::to_string(t.layer) + "." + t.module;
    if (t.r != first.r) rank_pattern[key] = t.r;
    if (t.alpha != first.alpha) alpha_pattern[key] = t.alpha;
  }
  // The adapted modules named one by one (as PEFT writes a resolved target list), so PEFT adapts
  // exactly these whatever the options were; the rank and alpha of each module that differs from
  // the first one's go in the patterns (full names, which match only themselves).
  // Expert weights go in target_parameters by their full names (PEFT matches a name equal to the key,
  // and nests two on one module in registration order, as shardlm names their adapters).
  json targets = json::array(), parameters = json::array();
  for (const auto& t : plan.targets)
    (t.experts > 0 ? parameters : targets).push_back("model.layers." + std::to_string(t.layer) + "." + t.module);
  const bool rslora = std::abs(first.scaling - first.alpha / static_cast<double>(first.r)) > 1e-12 * std::abs(first.scaling);
  std::vector<std::string> saved;
  for (const auto& n : plan.trained_in_full) saved.push_back(n == "lm_head.weight" ? "lm_head" : "embed_tokens");
  j.update({{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"peft_version", "0.22.0"},
            {"base_model_name_or_path", base.empty() ? json(nullptr) : json(base)}, {"r", first.r},
            {"lora_alpha", first.alpha}, {"lora_dropout", plan.dropout}, {"target_modules", targets},
            {"use_rslora", rslora}, {"bias", "none"}, {"use_dora", false},
            {"init_lora_weights", plan.init == "gaussian" ? json("gaussian") : json(plan.init == "true")},
            {"modules_to_save", saved.empty() ? json(nullptr) : json(saved)}, {"layers_to_transform", nullptr},
            {"rank_pattern", rank_pattern}, {"alpha_pattern", alpha_pattern},
            {"target_parameters", parameters.empty() ? json(nullptr) : parameters}});
  (void)modules, (void)layers;
  return j;
}

void write_peft_adapter_dir(const std::string& dir, const model::Llama& model,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& base) {
  std::filesystem::create_directories(dir);
  io::save_safetensors(dir + "/adapter_model.safetensors", peft_adapter_tensors(tensors), {{"format", "pt"}});
  std::ofstream out(dir + "/adapter_config.json");
  out << peft_adapter_config(model, base).dump(2) << "\n";
  if (!out) fail("cannot write ", dir, "/adapter_config.json");
}

}  // namespace shardlm::train
