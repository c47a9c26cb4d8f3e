// See config_deepspeed.h. The "auto" rules are Hugging Face's (transformers'
// integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process / _finalize) with
// shardlm's own value where HF takes a TrainingArguments one; the defaults are the pinned
// DeepSpeed's (0.19.8: ops/adam/fused_adam.py, ops/lamb/fused_lamb.py, runtime/lr_schedules.py).
#include "train/config_deepspeed.h"

#include <cmath>
#include <map>

#include "train/config_keys.h"
#include "util/error.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

const ConfigKey* find_key(const std::string& path) {
  static const std::map<std::string, const ConfigKey*> by_path = [] {
    std::map<std::string, const ConfigKey*> m;
    for (const auto& k : config_keys()) m[k.path] = &k;
    return m;
  }();
  const auto it = by_path.find(path);
  return it == by_path.end() ? nullptr : it->second;
}

// The keys whose "auto" follows from something other than the key's own default.
const std::set<std::string>& derived_autos() {
  static const std::set<std::string> keys = {
      "train_batch_size", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
      "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
      "zero_optimization.stage3_param_persistence_threshold"};
  return keys;
}

void take_autos(json& node, const std::string& prefix, std::set<std::string>& autos) {
  for (auto it = node.begin(); it != node.end();) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && path != "model") {
      take_autos(*it, path, autos);
      ++it;
      continue;
    }
    const ConfigKey* k = it->is_string() && it->get<std::string>() == "auto" ? find_key(path) : nullptr;
    // shardlm's own keys keep "auto" as the value it is for them (attn_implementation, comm.backend, ...).
    if (!k || k->deepspeed == DeepSpeed::None) {
      ++it;
      continue;
    }
    const ConfigKey* target = k->deepspeed == DeepSpeed::Alias ? find_key(k->alias_of) : k;
    // Where "auto" is itself the value that leaves a missing feature off (data_types.keep_in_fp32_modules,
    // DeepSpeed's default), it is read as that value.
    if (target && target->deepspeed == DeepSpeed::Refused && target->harmless && target->harmless(*it)) {
      ++it;
      continue;
    }
    const bool has_value = target && target->deepspeed != DeepSpeed::Refused && target->set &&
                           (target->get || target->deepspeed == DeepSpeed::NoEffect);
    if (!has_value)
      fail("config key ", path, " is \"auto\", which shardlm has no value of its own to fill in; give the value "
           "(e.g. --", path, "=VALUE)");
    autos.insert(target->path);
    it = node.erase(it);
  }
}

// A null is Python's None to DeepSpeed: the key's default. Taken out (it reads as absent) with a notice.
void take_nulls(json& node, const std::string& prefix, std::vector<std::string>& notices) {
  for (auto it = node.begin(); it != node.end();) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_null()) {
      notices.push_back(path + ": null, read as not given (DeepSpeed's None: the default)");
      it = node.erase(it);
      continue;
    }
    if (it->is_object() && path != "model") take_nulls(*it, path, notices);
    ++it;
  }
}

bool has(const std::set<std::string>& s, const std::string& k) { return s.count(k) != 0; }

// DeepSpeed's bf16 masters (bf16.bf16_master_weights_and_grads, 0.19.8): its ZeRO optimizer keeps the
// bf16 partition as the master (base_optimizer.py _configure_master_weights) and its CPU Adam computes
// each update in fp32 and stores it once, rounded to nearest even, with no compensation
// (csrc/adam/cpu_adam_impl.cpp Step_1): optimizer.master_precision "bf16" with master_rounding
// "nearest". Its moments are bf16 with bf16_optimizer_states, or with fp32_optimizer_states false
// (cpu_adam.py makes them in the masters' dtype). The gradient partition has the masters' dtype too,
// so clipping and the step see bf16 gradients (stage_1_and_2.py, stage3.py); shardlm's gradient shard is
// data_types.grad_accum_dtype at stages 2-3, which DeepSpeed defaults to the model's dtype, bf16. What the
// config gives itself stays; check_relations refuses what contradicts the mapping (config_ranges.cpp).
void resolve_bf16_masters(TrainConfig& c, const std::set<std::string>& given) {
  if (!c.bf16_master_weights_and_grads) return;
  auto& o = c.optimizer;
  std::string set;
  auto take = [&](const std::string& key, std::string& field, const std::string& value) {
    if (has(given, key)) return;
    field = value;
    set += (set.empty() ? "" : ", ") + key + " \"" + value + "\"";
  };
  take("optimizer.master_precision", o.master_precision, "bf16");
  take("optimizer.master_rounding", o.master_rounding, "nearest");
  take("optimizer.state_precision", o.state_precision,
       c.bf16_optimizer_states || !o.fp32_optimizer_states ? "bf16" : "fp32");
  take("data_types.grad_accum_dtype", c.grad_accum_dtype, "bf16");
  if (!set.empty())
    c.notices.push_back("bf16.bf16_master_weights_and_grads true" +
                        std::string(c.bf16_optimizer_states ? " and bf16.bf16_optimizer_states true" : "") +
                        ": read as " + set + " (DeepSpeed's bf16 masters: one rounding to nearest per step, "
                        "gradients in bf16)");
  if (c.bf16_optimizer_states && has(given, "optimizer.params.fp32_optimizer_states") && o.fp32_optimizer_states)
    c.notices.push_back("optimizer.params.fp32_optimizer_states true: overridden by bf16.bf16_optimizer_states "
                        "(bf16 moments), as DeepSpeed overrides it with a warning");
}

}  // namespace

void take_older_zero_form(json& root, std::vector<std::string>& notices) {
  // The oldest ZeRO form (zero/config.py read_zero_config_deprecated): true is stage 1 with the
  // top-level allgather_size as its allgather_bucket_size, false stage 0.
  if (root.contains("zero_optimization") && root["zero_optimization"].is_boolean()) {
    const bool on = root["zero_optimization"].get<bool>();
    json z = {{"stage", on ? 1 : 0}};
    if (on && root.contains("allgather_size")) z["allgather_bucket_size"] = root["allgather_size"];
    root.erase("allgather_size");
    root["zero_optimization"] = z;
    notices.push_back(std::string("zero_optimization: ") + (on ? "true" : "false") +
                      " read as DeepSpeed's older form of {\"stage\": " + (on ? "1" : "0") + "}");
  }
}

std::set<std::string> take_deepspeed_forms(json& root, std::vector<std::string>& notices) {
  // JSON has no comments; configs carry them as "_comment" keys, which DeepSpeed ignores.
  for (auto it = root.begin(); it != root.end();) {
    if (it.key().rfind("_comment", 0) == 0) {
      notices.push_back(it.key() + ": a comment, ignored");
      it = root.erase(it);
    } else {
      ++it;
    }
  }
  // DeepSpeed still reads "bfloat16" as "bf16" (runtime/constants.py BFLOAT16_OLD); "bf16" wins.
  if (root.contains("bfloat16")) {
    if (root.contains("bf16")) {
      notices.push_back("bfloat16: DeepSpeed's older name of bf16, ignored next to bf16 as DeepSpeed does");
    } else {
      root["bf16"] = root["bfloat16"];
      notices.push_back("bfloat16: read as bf16 (DeepSpeed's older name)");
    }
    root.erase("bfloat16");
  }
  take_older_zero_form(root, notices);
  take_nulls(root, "", notices);
  std::set<std::string> autos;
  take_autos(root, "", autos);
  return autos;
}

void resolve_deepspeed_values(TrainConfig& c, const std::set<std::string>& given, const std::set<std::string>& autos) {
  auto& o = c.optimizer;
  const auto absent = [&](const std::string& k) { return !has(given, k) && !has(autos, k); };
  // A DeepSpeed optimizer named in the config is built with its constructor's defaults for what the
  // config leaves out (FusedAdam, FusedLamb; torch.optim.AdamW under torch_adam), as DeepSpeed does.
  if (has(given, "optimizer.type")) {
    const bool torch_adamw = o.torch_adam && o.type != "Lamb" && (o.type == "AdamW" || o.adam_w_mode);
    const std::vector<std::pair<std::string, std::function<void()>>> defaults = {
        {"optimizer.params.lr", [&] { o.lr = 1e-3; }},
        {"optimizer.params.betas", [&] { o.beta1 = 0.9, o.beta2 = 0.999; }},
        {"optimizer.params.eps", [&] { o.eps = 1e-8; }},
        {"optimizer.params.weight_decay", [&] { o.weight_decay = torch_adamw ? 1e-2 : 0.0; }}};
    for (const auto& [key, set] : defaults)
      if (absent(key)) {
        set();
        c.notices.push_back(key + " not given: " + o.type + "'s DeepSpeed default " +
                            format_config_value(find_key(key)->get(c)));
      }
  }
  resolve_bf16_masters(c, given);
  auto& s = c.scheduler;
  if (has(autos, "scheduler.params.warmup_max_lr")) s.warmup_max_lr = o.lr;  // HF: learning_rate
  else if (!has(given, "scheduler.params.warmup_max_lr")) s.warmup_max_lr = s.type == "WarmupLR" ? o.lr : 1e-3;
  if (has(autos, "scheduler.params.warmup_num_steps")) s.warmup_num_steps = 1;  // HF: max(1, warmup_steps)
  if (has(autos, "train_batch_size")) c.train_batch_size_auto = true;
}

std::string name_bf16_masters_key(const TrainConfig& c, const std::set<std::string>& given, std::string message) {
  const std::string master = "optimizer.master_precision \"bf16\"";
  if (!c.bf16_master_weights_and_grads || has(given, "optimizer.master_precision") || message.rfind(master, 0) != 0)
    return message;
  const std::string fp32_fix = "optimizer.master_precision to \"fp32\"";
  for (size_t at; (at = message.find(fp32_fix)) != std::string::npos;)
    message.replace(at, fp32_fix.size(), "bf16.bf16_master_weights_and_grads to false");
  return "bf16.bf16_master_weights_and_grads = true (read as " + master + "): " + message;
}

void resolve_model_autos(TrainConfig& c, const std::set<std::string>& autos) {
  const double h = static_cast<double>(c.model.hidden_size);
  if (has(autos, "zero_optimization.reduce_bucket_size")) c.zero.reduce_bucket_size = h * h;
  if (has(autos, "zero_optimization.stage3_prefetch_bucket_size"))
    c.zero.stage3_prefetch_bucket_size = std::floor(0.9 * h * h);  // int(0.9 * hidden_size * hidden_size)
  if (has(autos, "zero_optimization.stage3_param_persistence_threshold"))
    c.zero.stage3_param_persistence_threshold = 10 * h;
}

void add_deepspeed_notices(TrainConfig& c, const std::set<std::string>& given, const std::set<std::string>& autos) {
  for (const auto& path : autos) {
    const ConfigKey* k = find_key(path);
    std::string value;
    if (path == "train_batch_size") value = "micro-batch × accumulation × data-parallel ranks";  // resolve_for adds it
    else if ((path == "train_micro_batch_size_per_gpu" || path == "gradient_accumulation_steps") &&
             has(given, "train_batch_size"))
      value = "derived from train_batch_size";
    else if (path == "scheduler.params.total_num_steps" && c.scheduler.total_num_steps == 0)
      value = "the run's steps, " + std::to_string(c.steps);
    else if (k->get)
      value = format_config_value(k->get(c));
    else
      value = "accepted without effect";
    std::string why;
    if (path == "scheduler.params.warmup_max_lr") why = " (optimizer.params.lr)";
    else if (path == "scheduler.params.warmup_num_steps") why = " (Hugging Face's max(1, warmup steps); no warm-up of its own)";
    else if (path.rfind("zero_optimization.", 0) == 0 && has(derived_autos(), path))
      why = " (Hugging Face's formula of hidden_size " + std::to_string(c.model.hidden_size) + ")";
    else if (k->get && !has(derived_autos(), path))
      why = " (shardlm's value)";
    c.notices.push_back(path + " \"auto\": " + value + why);
  }
  for (const auto& k : config_keys()) {
    if (!has(given, k.path)) continue;
    if (k.deepspeed == DeepSpeed::Alias)
      c.notices.push_back(k.path + ": DeepSpeed's older name of " + k.alias_of);
    else if (k.deepspeed == DeepSpeed::NoEffect)
      c.notices.push_back(k.path + ": accepted without effect; " + k.help);
    else if (k.deepspeed == DeepSpeed::Refused)  // given the value that matches what shardlm does
      c.notices.push_back(k.path + ": accepted as " + k.harmless_doc + ", what shardlm does; " + k.help);
  }
  if (c.device != "cuda") {
    if (c.zero.offload_optimizer.device == "cpu")
      c.notices.push_back("zero_optimization.offload_optimizer.device \"cpu\": on a CPU run the optimizer states "
                          "already live in host memory; at ZeRO stages 1-3 the step runs through the host optimizer "
                          "(chunked multi-threaded CPU AdamW), bit-identical to none");
    if (c.zero.offload_param.device == "cpu")
      c.notices.push_back("zero_optimization.offload_param.device \"cpu\": on a CPU run the parameters already "
                          "live in host memory; nothing to offload");
  }
  for (const auto& path : given)
    if (path.rfind("scheduler.params.", 0) == 0 && c.scheduler.type == "constant")
      c.notices.push_back(path + ": no effect with scheduler.type \"constant\" (the lr stays optimizer.params.lr)");
  if (has(given, "optimizer.params.fp32_optimizer_states") && !c.bf16_master_weights_and_grads)
    c.notices.push_back("optimizer.params.fp32_optimizer_states: no effect without "
                        "bf16.bf16_master_weights_and_grads (DeepSpeed's CPU Adam makes fp32 masters' moments fp32 "
                        "either way); shardlm's moments follow optimizer.state_precision");
  if (c.optimizer.type == "AdamW" && has(given, "optimizer.params.adam_w_mode"))
    c.notices.push_back(std::string("optimizer.params.adam_w_mode ") + (c.optimizer.adam_w_mode ? "true" : "false") +
                        ": no effect with type AdamW (DeepSpeed builds AdamW with decoupled weight decay whatever "
                        "adam_w_mode says; type Adam with adam_w_mode false is L2)");
  // A key given but not written to train_config.json (its value is the one the run's type implies).
  for (const auto& k : config_keys())
    if (k.written && k.get && has(given, k.path) && !k.written(c) &&
        !(k.path == "optimizer.params.adam_w_mode" && c.optimizer.type == "AdamW") &&
        k.path != "optimizer.params.fp32_optimizer_states" &&
        !(k.path.rfind("scheduler.params.", 0) == 0 && c.scheduler.type == "constant"))
      c.notices.push_back(k.path + " = " + format_config_value(k.get(c)) + ": the value the run's " +
                          (k.path.rfind("scheduler.", 0) == 0 ? "scheduler" : "optimizer") +
                          " type implies, left out of train_config.json");
}

}  // namespace shardlm::train
