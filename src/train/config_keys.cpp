// The training config's keys, one row each (config_keys.h says what derives from them). A row names
// its TrainConfig field through FIELD(...), whose type gives the key's JSON type check; the field's
// initializer in config.h is the key's default. Rows are in the order each section lists its
// valid keys in an unknown-key error.
#include "train/config_keys.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <type_traits>

#include "model/llama_config.h"
#include "plan/planner.h"
#include "train/config_ranges.h"
#include "train/config_types.h"
#include "util/error.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

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

// A row under construction: key(...) or refused(...), then its checks and notes.
class Row {
 public:
  explicit Row(ConfigKey k) : k_(std::move(k)) {}
  Row& at_least(double v) { return bound_min(v, false); }
  Row& above(double v) { return bound_min(v, true); }
  Row& within(double lo, double hi) {  // [lo, hi]
    bound_min(lo, false);
    k_.range.has_max = true;
    k_.range.max = hi;
    return *this;
  }
  Row& within_below(double lo, double hi) {  // [lo, hi)
    within(lo, hi);
    k_.range.max_open = true;
    return *this;
  }
  Row& whole(std::string unit) {
    k_.range.whole = true;
    k_.range.unit = std::move(unit);
    return *this;
  }
  Row& finite() { k_.range.finite = true; return *this; }
  Row& hint(std::string h) { k_.hint = std::move(h); return *this; }
  Row& fix(std::string f) { k_.fix = std::move(f); return *this; }
  Row& choice(json v, std::string what = "") { k_.choices.emplace_back(std::move(v), std::move(what)); return *this; }
  Row& required(std::string fix) { k_.required = true, k_.fix = std::move(fix); return *this; }
  Row& only_if(std::function<bool(const TrainConfig&)> when, std::string doc) {
    k_.applies = std::move(when), k_.applies_doc = std::move(doc);
    return *this;
  }
  Row& optional(std::string default_doc) { k_.optional = true, k_.default_doc = std::move(default_doc); return *this; }
  Row& written_as(std::function<json(const TrainConfig&)> write) { k_.write = std::move(write); return *this; }
  Row& written_if(std::function<bool(const TrainConfig&)> when) { k_.written = std::move(when); return *this; }
  // Refuses one value of the key's type with `why` (a DeepSpeed value shardlm has not built).
  Row& refusing(json value, std::string why) {
    auto set = k_.set;
    const std::string path = k_.path;
    k_.set = [=](TrainConfig& c, const json& v) {
      if (v == value) fail(path, " = ", v.dump(), ": ", why);
      set(c, v);
    };
    return *this;
  }
  operator ConfigKey() const { return k_; }  // NOLINT: rows convert implicitly into the table

 private:
  Row& bound_min(double v, bool open) {
    k_.range.has_min = true, k_.range.min = v, k_.range.min_open = open;
    return *this;
  }
  ConfigKey k_;
};

// FIELD(data.seq_len): the TrainConfig field a row reads and sets.
#define FIELD(member) [](auto& c) -> auto& { return c.member; }

template <typename Ref>
Row key(DeepSpeed ds, std::string path, Ref ref, std::string help) {
  using T = std::remove_reference_t<decltype(ref(std::declval<TrainConfig&>()))>;
  static_assert(!std::is_const_v<T>);
  ConfigKey k;
  k.path = std::move(path), k.help = std::move(help), k.deepspeed = ds, k.type = type_name<T>();
  k.type_problem = [](const json& v) { return json_type_problem<T>(v); };
  k.set = [ref](TrainConfig& c, const json& v) { ref(c) = v.get<T>(); };
  k.get = [ref](const TrainConfig& c) { return json(ref(c)); };
  return Row(std::move(k));
}

// A key whose JSON type, field and writing are not one field's (optimizer.params.betas, device_memory).
Row custom(DeepSpeed ds, std::string path, std::string type, std::string help,
           std::function<std::string(const json&)> type_problem, std::function<void(TrainConfig&, const json&)> set,
           std::function<json(const TrainConfig&)> get) {
  ConfigKey k;
  k.path = std::move(path), k.type = std::move(type), k.help = std::move(help), k.deepspeed = ds;
  k.type_problem = std::move(type_problem), k.set = std::move(set), k.get = std::move(get);
  return Row(std::move(k));
}

// DeepSpeed's older name of the key at `of`, read into the same field (bound by make_table).
Row alias(std::string path, std::string of) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of);
  k.help = "older name of `" + k.alias_of + "`";
  return Row(std::move(k));
}

// A DeepSpeed key for a feature shardlm lacks: accepted while harmless(value), else refused with `why`.
Row refused(std::string path, std::string type, std::function<bool(const json&)> harmless, std::string harmless_doc,
            std::string help, std::string why) {
  ConfigKey k;
  k.path = std::move(path), k.type = std::move(type), k.help = std::move(help), k.deepspeed = DeepSpeed::Refused;
  k.harmless = std::move(harmless), k.harmless_doc = std::move(harmless_doc), k.why = std::move(why);
  return Row(std::move(k));
}
// A DeepSpeed key whose value must be `supported` (shardlm implements only that behaviour).
Row only(std::string path, const json& supported, std::string help, std::string why) {
  return refused(std::move(path), supported.is_boolean() ? "bool" : "value",
                 [supported](const json& v) { return v == supported; }, format_config_value(supported),
                 std::move(help), std::move(why));
}

// A DeepSpeed key that changes nothing shardlm computes and sets no field: type-checked, then
// accepted with a one-line notice (load_train_config) saying why it has no effect.
template <typename T>
Row noted(std::string path, std::string help) {
  ConfigKey k;
  k.path = std::move(path), k.help = std::move(help), k.deepspeed = DeepSpeed::NoEffect, k.type = type_name<T>();
  k.type_problem = [](const json& v) { return json_type_problem<T>(v); };
  k.set = [](TrainConfig&, const json&) {};
  return Row(std::move(k));
}

// A DeepSpeed section read as one unit that changes nothing shardlm computes (its keys are
// DeepSpeed's, a JSON object of any of them): accepted with a one-line notice.
Row noted_section(std::string path, std::string help) {
  ConfigKey k;
  k.path = std::move(path), k.help = std::move(help), k.deepspeed = DeepSpeed::NoEffect, k.type = "object";
  k.type_problem = [](const json& v) -> std::string { return v.is_object() ? "" : "must be a JSON object"; };
  k.set = [](TrainConfig&, const json&) {};
  return Row(std::move(k));
}

// DeepSpeed's older name of a whole section ("bfloat16" for "bf16"): take_deepspeed_forms
// (config_deepspeed.cpp) reads it as that section before the table is walked.
Row older_section(std::string path, std::string of) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of), k.type = "object";
  k.help = "older name of the `" + k.alias_of + "` section, read as it";
  k.type_problem = [](const json& v) -> std::string { return v.is_object() ? "" : "must be a JSON object"; };
  return Row(std::move(k));
}

// A DeepSpeed section for a feature that changes the arithmetic and that shardlm lacks: accepted
// only switched off ({"enabled": false}), else refused with `why`.
Row refused_section(std::string path, std::string help, std::string why, bool can_disable = true) {
  return refused(std::move(path), "object",
                 [can_disable](const json& v) {
                   return can_disable && v.is_object() && v.contains("enabled") && v["enabled"] == false;
                 },
                 can_disable ? "{\"enabled\": false}" : "absent", std::move(help), std::move(why));
}

// DeepSpeed's deprecated boolean spelling of an offload (zero_optimization.cpu_offload: true is
// offload_optimizer {"device": "cpu"}), read into the device of the section that replaced it.
Row offload_flag(std::string path, std::string of, std::function<std::string&(TrainConfig&)> device) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of), k.type = "bool";
  k.help = "older spelling: true is `" + k.alias_of + "` \"cpu\"";
  k.type_problem = [](const json& v) { return json_type_problem<bool>(v); };
  k.set = [device](TrainConfig& c, const json& v) {
    if (v.get<bool>()) device(c) = "cpu";
  };
  return Row(std::move(k));
}

bool is_false(const json& v) { return v == false; }
const char* const kNoOneCycle =
    "DeepSpeed's OneCycle schedule is not implemented in shardlm (its schedules: constant, WarmupLR, WarmupDecayLR, "
    "WarmupCosineLR); remove OneCycle's params and choose one of those with scheduler.type";
const char* const kNoLrRangeTest =
    "DeepSpeed's LRRangeTest schedule is not implemented in shardlm (its schedules: constant, WarmupLR, "
    "WarmupDecayLR, WarmupCosineLR); remove LRRangeTest's params and choose one of those with scheduler.type";
bool lamb(const TrainConfig& c) { return c.optimizer.type == "Lamb"; }
// A scheduler param is written to train_config.json when the run's scheduler takes it.
std::function<bool(const TrainConfig&)> takes(std::string param) {
  return [param](const TrainConfig& c) { return scheduler_takes(c.scheduler.type, param); };
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// optimizer.type as the pinned DeepSpeed (0.19.8) reads it: its own optimizers by any case
// (DEEPSPEED_OPTIMIZERS), stored under one spelling; the 1-bit family it removed, and the
// optimizers shardlm does not implement, refused by name.
void set_optimizer_type(TrainConfig& c, const json& v) {
  const std::string name = v.get<std::string>(), low = lower(name);
  if (low == "adamw") c.optimizer.type = "AdamW";
  else if (low == "adam") c.optimizer.type = "Adam";
  else if (low == "lamb") c.optimizer.type = "Lamb";
  else if (low == "onebitadam" || low == "zerooneadam" || low == "onebitlamb")
    fail("optimizer.type = \"", name, "\": the 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) are not in the "
         "pinned DeepSpeed 0.19.8 (removed from deepspeed/runtime/fp16/onebit), and shardlm does not implement their "
         "compressed communication; use \"Adam\" (what they compute before compression starts) or \"Lamb\"");
  else
    fail("optimizer.type must be \"AdamW\", \"Adam\" or \"Lamb\" (any case, as DeepSpeed), got \"", name,
         "\": shardlm does not implement it");
}

bool fp16_on(const TrainConfig& c) { return c.fp16.enabled; }

// A dtype as DeepSpeed's DtypeEnum spells it ("half", "torch.bfloat16", ...), as shardlm names it; "" if none.
std::string dtype_name(const std::string& given) {
  const std::string n = lower(given);
  for (const auto& [name, spellings] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"fp16", {"fp16", "float16", "half", "torch.float16"}},
           {"bf16", {"bf16", "bfloat16", "torch.bfloat16"}},
           {"fp32", {"fp32", "float32", "float", "torch.float32"}}})
    for (const auto& s : spellings)
      if (n == s) return name;
  return "";
}

// data.blend: Megatron's --data-path list, [weight, file, weight, file, ...]; a weight may be a
// number or a string holding one ("0.3", as Megatron's command line gives it).
std::string blend_type_problem(const json& v) {
  if (!v.is_array() || v.empty() || v.size() % 2 != 0)
    return "a list of weight and file pairs, [weight, file, weight, file, ...]";
  for (size_t i = 0; i < v.size(); i += 2) {
    const json& w = v[i];
    bool number = w.is_number();
    if (w.is_string()) {
      char* end = nullptr;
      const std::string text = w.get<std::string>();
      std::strtod(text.c_str(), &end);
      number = !text.empty() && end && *end == '\0';
    }
    if (!number) return "a number at position " + std::to_string(i + 1) + " (a weight), not " + w.dump();
    if (!v[i + 1].is_string() || v[i + 1].get<std::string>().empty())
      return "a token file or glob at position " + std::to_string(i + 2) + ", not " + v[i + 1].dump();
  }
  return "";
}

std::vector<std::pair<double, std::string>> parse_blend(const json& v) {
  std::vector<std::pair<double, std::string>> out;
  for (size_t i = 0; i < v.size(); i += 2) {
    const double w = v[i].is_string() ? std::strtod(v[i].get<std::string>().c_str(), nullptr) : v[i].get<double>();
    if (!std::isfinite(w) || w <= 0)
      fail("data.blend: the weight of ", v[i + 1].dump(), " is ", v[i].dump(), "; every weight must be a finite "
           "number > 0 (leave a dataset out instead of giving it weight 0)");
    out.emplace_back(w, v[i + 1].get<std::string>());
  }
  return out;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + ("`" + n + "`");
  return out;
}

// Model fields as accepted back by the "model" section (HF keys minus the descriptive ones).
json model_fields_json(const model::LlamaConfig& m) {
  json j = model::to_hf_json(m);
  for (const char* k : {"architectures", "torch_dtype"}) j.erase(k);
  return j;
}

std::vector<ConfigKey> make_table() {
  const std::string kAio = "tuning of DeepSpeed's aio library; shardlm's NVMe store has its own (O_DIRECT on 2 threads)";
  const std::string kDeepCompileMemory = "a DeepCompile memory option; shardlm does not compile the model";
  const auto D = DeepSpeed::Same, OWN = DeepSpeed::None, NOEFFECT = DeepSpeed::NoEffect;
  const auto kNotWritten = [](std::string monitor, std::string then) {
    return monitor + " monitor, not written: shardlm writes metrics.jsonl, and with tensorboard.enabled TensorBoard "
           "event files (" + then + ")";
  };
  const std::string derive = "leave it out next to train_batch_size to derive it from the other two";
  std::vector<ConfigKey> t = {
      key(D, "train_micro_batch_size_per_gpu", FIELD(micro_batch), "sequences per rank per micro-step")
          .at_least(1).fix(derive),
      key(D, "gradient_accumulation_steps", FIELD(grad_accum),
          "micro-steps per optimizer step (with pipeline parallelism: the micro-batches of a pipeline step)")
          .at_least(1).fix(derive),
      key(D, "train_batch_size", FIELD(train_batch_size),
          "must equal micro-batch × accumulation × data-parallel ranks, else an error shows the arithmetic; a batch "
          "key left out next to it is derived (DeepSpeed configs)")
          .at_least(1).optional("not set").fix("leave it out to let it follow from the other two")
          .written_if([](const TrainConfig& c) { return c.train_batch_size != 0; }),
      key(D, "gradient_clipping", FIELD(gradient_clipping), "global L2 norm limit, `clip_grad_norm_` semantics")
          .at_least(0).hint("0 disables clipping"),
      key(OWN, "steps", FIELD(steps), "optimizer steps to train").at_least(1),
      key(OWN, "seed", FIELD(seed), "seed of the initial weights and of the shuffled data order"),
      key(OWN, "eval_interval", FIELD(eval_interval), "evaluate on data.val every this many steps; 0: only at the end")
          .at_least(0),
      key(OWN, "log_interval", FIELD(log_interval), "print a step's line every this many steps").at_least(1),
      key(OWN, "out_dir", FIELD(out_dir), "run directory: metrics, checkpoints, the final model"),
      key(OWN, "threads", FIELD(threads), "libtorch threads per rank").at_least(0).hint("0: cores / local ranks"),
      key(OWN, "init", FIELD(init),
          "HF directory (`config.json` + `model.safetensors`, or shards listed by `model.safetensors.index.json` "
          "as the Hub holds larger models) to start from; its config defines the model")
          .written_if([](const TrainConfig& c) { return !c.init.empty(); }),
      key(OWN, "checkpoint_interval", FIELD(checkpoint_interval), "also save a checkpoint every this many steps")
          .at_least(0).hint("0: only at the end"),
      key(OWN, "checkpoint_keep", FIELD(checkpoint_keep), "sharded checkpoints kept in `out_dir/checkpoints`")
          .at_least(1).hint("the newest checkpoints kept"),
      key(OWN, "checkpoint_async", FIELD(checkpoint_async),
          "copy each checkpoint's state to host memory and write its shards on a thread while training goes on; "
          "committed at the next save or the run's end (Checkpoints)"),
      custom(OWN, "device_memory", "bytes or size",
             "bytes per rank, a number or a size such as \"32GB\" or \"80GiB\": the run is refused before it "
             "starts when the plan does not fit (Memory guard); 0: what this machine has free",
             [](const json& v) -> std::string {
               return v.is_number() || v.is_string() ? ""
                                                     : "must be a number of bytes or a size such as \"32GB\" or \"80GiB\"";
             },
             [](TrainConfig& c, const json& v) {
               c.device_memory = v.is_number() ? v.get<double>() : plan::parse_bytes(v.get<std::string>());
             },
             [](const TrainConfig& c) { return json(c.device_memory); })
          .at_least(0).hint("0: no limit"),
      key(OWN, "machine_profile", FIELD(machine_profile),
          "a `shardlm bench machine --out` profile: plan.json then holds this run's predicted seconds per phase "
          "(Time model), and the end-of-run diagnosis and the report compare them with the measured ones")
          .optional("not set").written_if([](const TrainConfig& c) { return !c.machine_profile.empty(); }),
      key(OWN, "resume", FIELD(resume),
          "continue from the newest good checkpoint in `out_dir/checkpoints` when present; false starts over and "
          "replaces them at its first save (`scripts/demo.sh` passes false)"),
      key(OWN, "device", FIELD(device),
          "also `--device cuda`; rank r uses GPU (local rank mod GPUs); without a GPU the run stops at once, saying so")
          .choice("cpu").choice("cuda"),
      key(OWN, "attn_implementation", FIELD(attn_implementation),
          "attention kernel; auto: sdpa on CUDA and for fp32/fp64 on CPU, eager for CPU bf16 without AVX-512 BF16 "
          "and CPU fp16 (Attention)")
          .choice("auto").choice("sdpa", "the library's fused `scaled_dot_product_attention`")
          .choice("eager", "HF's eager math, the parity reference"),

      custom(D, "optimizer.type", "string",
             "the optimizer, as the pinned DeepSpeed builds it; naming one gives its absent params DeepSpeed's "
             "defaults (lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0, or torch_adam AdamW's 0.01)",
             [](const json& v) { return json_type_problem<std::string>(v); }, set_optimizer_type,
             [](const TrainConfig& c) { return json(c.optimizer.type); })
          .choice("AdamW", "decoupled weight decay").choice("Adam", "AdamW's arithmetic unless adam_w_mode is false")
          .choice("Lamb", "FusedLamb's layer-wise trust ratio; not with ZeRO stages 1-3 or tensor parallelism")
          .hint("any case, as DeepSpeed"),
      key(D, "optimizer.params.lr", FIELD(optimizer.lr), "peak learning rate").finite().at_least(0),
      custom(D, "optimizer.params.betas", "[number, number]", "AdamW's [beta1, beta2]",
             [](const json& v) { return json_type_problem<std::vector<double>>(v); },
             [](TrainConfig& c, const json& v) {
               const auto betas = v.get<std::vector<double>>();
               if (betas.size() != 2) fail("optimizer.params.betas must be [beta1, beta2], got ", v.dump());
               c.optimizer.beta1 = betas[0], c.optimizer.beta2 = betas[1];
             },
             [](const TrainConfig& c) { return json{c.optimizer.beta1, c.optimizer.beta2}; })
          .within_below(0, 1).hint("both; e.g. [0.9, 0.95]"),
      key(D, "optimizer.params.eps", FIELD(optimizer.eps), "AdamW's epsilon").above(0),
      key(D, "optimizer.params.weight_decay", FIELD(optimizer.weight_decay),
          "decoupled weight decay (Adam with adam_w_mode false: L2, added to the gradient), applied to tensors with "
          ">= 2 dimensions")
          .at_least(0),
      key(D, "optimizer.params.adam_w_mode", FIELD(optimizer.adam_w_mode),
          "Adam: true is AdamW's arithmetic, false L2-regularized Adam (torch.optim.Adam); AdamW ignores it, as "
          "DeepSpeed does")
          .optional("`true`").written_if([](const TrainConfig& c) { return c.optimizer.type == "Adam"; }),
      key(D, "optimizer.params.bias_correction", FIELD(optimizer.bias_correction),
          "Adam, AdamW, Lamb: false uses the moments without bias correction (DeepSpeed's FusedAdam/FusedLamb)")
          .optional("`true`").written_if([](const TrainConfig& c) { return !c.optimizer.bias_correction; }),
      key(NOEFFECT, "optimizer.params.torch_adam", FIELD(optimizer.torch_adam),
          "DeepSpeed's choice of torch.optim.Adam(W) over FusedAdam: the same arithmetic (only the default "
          "weight_decay differs: AdamW's 0.01)")
          .optional("`false`").written_if([](const TrainConfig& c) { return c.optimizer.torch_adam; }),
      key(D, "optimizer.params.max_coeff", FIELD(optimizer.max_coeff), "Lamb: the trust ratio's upper clamp")
          .above(0).optional("`10`").written_if(lamb),
      key(D, "optimizer.params.min_coeff", FIELD(optimizer.min_coeff), "Lamb: the trust ratio's lower clamp")
          .at_least(0).optional("`0.01`").written_if(lamb),
      key(D, "optimizer.params.eps_inside_sqrt", FIELD(optimizer.eps_inside_sqrt),
          "Lamb: m / sqrt(v + eps) instead of m / (sqrt(v) + eps)")
          .optional("`false`").written_if(lamb),
      only("optimizer.params.amsgrad", false, "AMSGrad is not implemented (DeepSpeed's FusedAdam refuses it too)",
           "AMSGrad is not implemented (DeepSpeed's FusedAdam and FusedLamb refuse it too); set it to false or remove "
           "it"),
      refused("optimizer.params.max_grad_norm", "number", [](const json&) { return false; }, "absent",
              "DeepSpeed refuses it: clipping is gradient_clipping",
              "DeepSpeed refuses an optimizer max_grad_norm; clipping is the top-level gradient_clipping key (e.g. "
              "\"gradient_clipping\": 1.0)"),
      noted<bool>("optimizer.params.set_grad_none", "FusedAdam's way of clearing gradients; shardlm clears them"),
      key(D, "optimizer.params.fp32_optimizer_states", FIELD(optimizer.fp32_optimizer_states),
          "DeepSpeed's CPU Adam state dtype: false with bf16.bf16_master_weights_and_grads keeps the moments in "
          "bf16 (optimizer.state_precision \"bf16\", as its CPU Adam makes them in the masters' dtype); no effect "
          "otherwise (shardlm's moments follow optimizer.state_precision)")
          .optional("`true`").written_if([](const TrainConfig& c) { return c.bf16_master_weights_and_grads; }),
      key(OWN, "optimizer.state_precision", FIELD(optimizer.state_precision),
          "how Adam's moments are stored; the update is computed in fp32 either way (Compact optimizer states)")
          .choice("fp32", "torch.optim.AdamW's states")
          .choice("bf16", "bf16 moments (torchao's bf16 optimizer states, AnyPrecisionAdamW)")
          .choice("8bit", "bitsandbytes AdamW8bit's block-wise dynamic quantization (256-element blocks); "
                          "parameters under optimizer.min_8bit_size keep fp32; not with Lamb or tensor parallelism")
          .optional("`\"fp32\"`").written_if([](const TrainConfig& c) { return c.optimizer.state_precision != "fp32"; }),
      key(OWN, "optimizer.min_8bit_size", FIELD(optimizer.min_8bit_size),
          "8-bit states: parameters with fewer elements keep fp32 moments (bitsandbytes' min_8bit_size)")
          .at_least(1).optional("`4096`")
          .written_if([](const TrainConfig& c) { return c.optimizer.state_precision == "8bit"; }),
      key(OWN, "optimizer.master_precision", FIELD(optimizer.master_precision),
          "the master weights the update is applied to; bf16 drops the fp32 copy (4 bytes per parameter) beside the "
          "bf16 working shard (Compact optimizer states)")
          .choice("fp32", "fp32 masters (mixed precision, DeepSpeed's bf16 optimizer)")
          .choice("bf16", "the bf16 shard is the master: bf16.enabled only, not with Lamb; with offload_optimizer "
                          "the bf16 master and Kahan's compensation live in host memory or the NVMe files; a CUDA run "
                          "needs offload_optimizer (its update is host code), and with offload_param offload_optimizer \"cpu\" "
                          "(the host parameter shards are its masters); rounded back by optimizer.master_rounding")
          .optional("`\"fp32\"`").written_if([](const TrainConfig& c) { return c.optimizer.master_precision != "fp32"; }),
      key(OWN, "optimizer.master_rounding", FIELD(optimizer.master_rounding),
          "bf16 masters: how the fp32 update returns to bf16")
          .choice("kahan", "torchdistx AnyPrecisionAdamW's Kahan summation (a bf16 compensation buffer, 2 bytes per "
                           "parameter)")
          .choice("stochastic", "torchao's bf16 stochastic rounding (AdamW bf16_stochastic_round), random bits "
                                "from Philox keyed by seed, step, parameter and element")
          .choice("nearest", "round to nearest even (plain bf16 training; the baseline the other two improve on)")
          .optional("`\"kahan\"`")
          .written_if([](const TrainConfig& c) { return c.optimizer.master_precision == "bf16"; }),

      custom(D, "scheduler.type", "string",
             "learning-rate schedule; the Warmup* curves are the pinned DeepSpeed's, step for step (Learning-rate "
             "schedules)",
             [](const json& v) { return json_type_problem<std::string>(v); },
             [](TrainConfig& c, const json& v) { c.scheduler.type = v.get<std::string>(); },
             [](const TrainConfig& c) { return json(c.scheduler.type); })
          .choice("constant").choice("WarmupLR", "warm-up from warmup_min_lr to warmup_max_lr, then constant")
          .choice("WarmupDecayLR", "the same warm-up, then linear decay to 0 at total_num_steps")
          .choice("WarmupCosineLR", "warm-up from lr × warmup_min_ratio to lr, then cosine decay to lr × cos_min_ratio"),
      key(D, "scheduler.params.warmup_min_lr", FIELD(scheduler.warmup_min_lr),
          "WarmupLR, WarmupDecayLR: the lr the warm-up starts from (and the first step's)")
          .finite().at_least(0).optional("`0`").written_if(takes("warmup_min_lr")),
      key(D, "scheduler.params.warmup_max_lr", FIELD(scheduler.warmup_max_lr),
          "WarmupLR, WarmupDecayLR: the lr the warm-up reaches; absent: WarmupLR uses optimizer.params.lr, "
          "WarmupDecayLR 1e-3 (DeepSpeed's defaults)")
          .finite().at_least(0).optional("`1e-3` (WarmupLR: optimizer.params.lr)").written_if(takes("warmup_max_lr")),
      key(D, "scheduler.params.warmup_num_steps", FIELD(scheduler.warmup_num_steps),
          "warm-up steps W (DeepSpeed takes max(2, W))")
          .at_least(1).optional("`1000`").written_if(takes("warmup_num_steps")),
      key(D, "scheduler.params.warmup_type", FIELD(scheduler.warmup_type), "the warm-up's curve")
          .choice("log", "log(i + 1) / log(W)").choice("linear", "i / W")
          .optional("`\"log\"`").written_if(takes("warmup_type")),
      key(D, "scheduler.params.warmup_min_ratio", FIELD(scheduler.warmup_min_ratio),
          "WarmupCosineLR's r0: warm-up starts at lr × r0")
          .within(0, 1).optional("`0`").written_if(takes("warmup_min_ratio")),
      key(D, "scheduler.params.cos_min_ratio", FIELD(scheduler.cos_min_ratio),
          "WarmupCosineLR's rmin: decay ends at lr × rmin")
          .within(0, 1).optional("`1e-4`").written_if(takes("cos_min_ratio")),
      key(D, "scheduler.params.total_num_steps", FIELD(scheduler.total_num_steps),
          "WarmupDecayLR, WarmupCosineLR: S, the step the decay ends at")
          .at_least(0).hint("0: the run's steps").optional("`0`").written_if(takes("total_num_steps")),
      only("scheduler.params.last_batch_iteration", -1, "resuming sets the scheduler's step; only -1",
           "shardlm's scheduler resumes from the checkpoint's step; last_batch_iteration other than -1 is not "
           "implemented. Remove it"),

      key(OWN, "data.train", FIELD(data.train),
          "training token file, or a glob of shards (\"DIR/train_*.bin\", read as one sequence in sorted order)")
          .required("give the training token file (e.g. data/brown/train.bin), or several in data.blend")
          .only_if([](const TrainConfig& c) { return c.data.blend.empty(); }, "without data.blend"),
      key(OWN, "data.val", FIELD(data.val), "validation token file or glob; \"\": no validation"),
      key(OWN, "data.seq_len", FIELD(data.seq_len), "tokens per sequence").at_least(1),
      key(OWN, "data.format", FIELD(data.format), "token file format")
          .choice("llmc", "llm.c `.bin` with a 1024-byte header, 16- or 32-bit ids as it says")
          .choice("raw_u16", "bare uint16 ids, nanoGPT").choice("raw_u32", "bare uint32 ids"),
      key(OWN, "data.eval_batches", FIELD(data.eval_batches), "how much of data.val an evaluation reads")
          .at_least(1).hint("micro-batches per rank per evaluation").fix("to skip validation set data.val to \"\""),
      key(OWN, "data.tokenizer", FIELD(data.tokenizer),
          "SentencePiece model or `tokenizer.json`, copied into out_dir for `generate`; \"\": none"),
      key(OWN, "data.shuffle", FIELD(data.shuffle), "training windows in a new seeded order each pass (Data order)"),
      custom(OWN, "data.blend", "[weight, file, weight, file, ...]",
             "several training datasets (token files or globs) drawn by weight, as Megatron-LM's --data-path "
             "blends them (Data order); in place of data.train",
             blend_type_problem,
             [](TrainConfig& c, const json& v) { c.data.blend = parse_blend(v); },
             [](const TrainConfig& c) {
               json j = json::array();
               for (const auto& [weight, path] : c.data.blend) j.push_back(weight), j.push_back(path);
               return j;
             })
          .optional("not set").hint("weights > 0, normalised to sum 1")
          .written_if([](const TrainConfig& c) { return !c.data.blend.empty(); }),
      key(OWN, "data.prefetch", FIELD(data.prefetch),
          "batches a background thread assembles ahead of the step (Data order); 0: on the step's thread")
          .at_least(0),

      key(OWN, "comm.timeout_s", FIELD(comm.timeout_s),
          "longest any rank waits in one communication before exiting with a message")
          .above(0),
      key(OWN, "comm.backend", FIELD(comm.backend), "collectives backend")
          .choice("auto", "nccl on cuda, mpi on cpu").choice("mpi").choice("nccl", "needs device \"cuda\""),
      key(OWN, "ddp.bucket_cap_mb", FIELD(ddp.bucket_cap_mb), "DDP's gradient bucket size (MB)").above(0),
      key(OWN, "debug.consistency_interval", FIELD(debug.consistency_interval),
          "compare replicated gradients and parameters across replicas every k steps (Debugging desyncs)")
          .at_least(0).hint("0: off, k: check every k steps"),
      key(OWN, "debug.check_collectives", FIELD(debug.check_collectives),
          "check before every collective that all ranks of the group make the same call"),

      key(D, "zero_optimization.stage", FIELD(zero.stage), "what ZeRO shards over the data-parallel ranks")
          .choice(0, "plain data parallelism, the ddp section").choice(1, "optimizer states").choice(2, "and gradients")
          .choice(3, "and parameters"),
      key(D, "zero_optimization.reduce_bucket_size", FIELD(zero.reduce_bucket_size),
          "elements per coalesced gradient reduce-scatter, at most the largest unit")
          .above(0).hint("elements"),
      key(D, "zero_optimization.allgather_bucket_size", FIELD(zero.allgather_bucket_size),
          "elements the post-step parameter refresh coalesces")
          .above(0).hint("elements"),
      key(D, "zero_optimization.overlap_comm", FIELD(zero.overlap_comm), "overlap communication with compute"),
      key(D, "zero_optimization.stage3_prefetch_bucket_size", FIELD(zero.stage3_prefetch_bucket_size),
          "ZeRO-3: elements gathered ahead of use")
          .whole("elements").at_least(0).hint("e.g. 5e7"),
      key(D, "zero_optimization.stage3_param_persistence_threshold", FIELD(zero.stage3_param_persistence_threshold),
          "ZeRO-3: units smaller than this (elements) stay gathered")
          .whole("elements").at_least(0).hint("e.g. 5e7"),
      key(NOEFFECT, "zero_optimization.contiguous_gradients", FIELD(zero.contiguous_gradients),
          "always on: gradients are copied into flat buffers"),
      only("zero_optimization.allgather_partitions", true, "the broadcast-based gather (false) is not implemented",
           "shardlm gathers updated parameters with one all-gather per unit; the broadcast-based gather "
           "(allgather_partitions=false) is not implemented. Set it to true or remove it"),
      only("zero_optimization.reduce_scatter", true, "the all-reduce-based reduction (false) is not implemented",
           "shardlm reduces gradients with reduce-scatter; the all-reduce-based reduction (reduce_scatter=false) "
           "is not implemented. Set it to true or remove it"),
      key(D, "zero_optimization.sub_group_size", FIELD(zero.sub_group_size),
          "elements per optimizer-step tile: with offload_optimizer.device nvme the states stream through the disk "
          "in chunks of min(this, 65536) elements; with offload_optimizer.device cpu the host optimizer steps chunks of "
          "min(this, 2^22) elements; otherwise shardlm steps per unit (no effect on the arithmetic)")
          .at_least(0),
      key(NOEFFECT, "zero_optimization.round_robin_gradients", FIELD(zero.round_robin_gradients),
          "gradient copy order (an offload optimisation)"),
      key(NOEFFECT, "zero_optimization.stage3_max_live_parameters", FIELD(zero.stage3_max_live_parameters),
          "not enforced: the gathered set follows the prefetch size and persistence threshold")
          .at_least(0),
      key(NOEFFECT, "zero_optimization.stage3_max_reuse_distance", FIELD(zero.stage3_max_reuse_distance),
          "not enforced: each unit is released after its use")
          .at_least(0),
      key(NOEFFECT, "zero_optimization.stage3_gather_16bit_weights_on_model_save",
          FIELD(zero.stage3_gather_16bit_weights_on_model_save), "shardlm always saves the full HF model"),
      alias("zero_optimization.stage3_gather_fp16_weights_on_model_save",
            "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
      key(NOEFFECT, "zero_optimization.ignore_unused_parameters", FIELD(zero.ignore_unused_parameters),
          "a Llama has none"),
      key(NOEFFECT, "zero_optimization.stage3_model_persistence_threshold",
          FIELD(zero.stage3_model_persistence_threshold),
          "not enforced: the per-unit stage3_param_persistence_threshold decides what stays gathered")
          .at_least(0),
      alias("zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"),
      alias("zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold"),
      alias("zero_optimization.model_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold"),
      alias("zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"),
      alias("zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance"),
      alias("zero_optimization.gather_16bit_weights_on_model_save",
            "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
      key(D, "zero_optimization.offload_optimizer.device", FIELD(zero.offload_optimizer.device),
          "optimizer-state offload: nvme keeps the fp32 masters (16-bit compute) and Adam moments in files under "
          "nvme_path, streamed through O_DIRECT buffers at each step (ZeRO stages 1-3, losses bit-identical to no "
          "offload); cpu on a CPU run steps the states in host memory through the host optimizer (ZeRO stages 1-3, "
          "chunked multi-threaded CPU AdamW, bit-identical to none; not Lamb); cpu on a CUDA run (ZeRO stages 1-3) "
          "keeps the masters and moments in host memory only and copies the gradients down and the parameters up "
          "through pinned buffers on side streams around that step, and nvme on a CUDA run streams them from the "
          "files through the same copies (neither yet run on a GPU)")
          .choice("none").choice("cpu").choice("nvme"),
      key(D, "zero_optimization.offload_optimizer.nvme_path", FIELD(zero.offload_optimizer.nvme_path),
          "with device nvme: the directory of the offloaded state files (a local disk; checked before training: "
          "exists, writable, free space for the states)"),
      key(D, "zero_optimization.offload_optimizer.buffer_count", FIELD(zero.offload_optimizer.buffer_count),
          "with device nvme: chunk buffers the states stream through (one read ahead, one stepping, writes in "
          "flight); at least 2")
          .at_least(0),
      key(NOEFFECT, "zero_optimization.offload_optimizer.pin_memory", FIELD(zero.offload_optimizer.pin_memory),
          "page-locked host buffers for GPU copies; shardlm always pins the host optimizer's buffers on a CUDA run, "
          "and a CPU run copies nothing to a GPU"),
      key(NOEFFECT, "zero_optimization.offload_optimizer.pipeline_read", FIELD(zero.offload_optimizer.pipeline_read),
          "DeepSpeed's NVMe read overlap; shardlm always reads the next chunk while one steps"),
      key(NOEFFECT, "zero_optimization.offload_optimizer.pipeline_write", FIELD(zero.offload_optimizer.pipeline_write),
          "DeepSpeed's NVMe write overlap; shardlm always writes chunks back asynchronously"),
      key(NOEFFECT, "zero_optimization.offload_optimizer.fast_init", FIELD(zero.offload_optimizer.fast_init),
          "DeepSpeed's faster start of NVMe offload; shardlm writes the initial states once, chunk by chunk, either "
          "way"),
      key(NOEFFECT, "zero_optimization.offload_optimizer.ratio", FIELD(zero.offload_optimizer.ratio),
          "share of the states stepped on the CPU; on a CPU run all of them are")
          .within(0, 1),
      key(NOEFFECT, "zero_optimization.offload_optimizer.super_offload", FIELD(zero.offload_optimizer.super_offload),
          "a GPU-superchip offload path; a CPU run copies nothing"),
      key(NOEFFECT, "zero_optimization.offload_optimizer.cpuadam_cores_perc",
          FIELD(zero.offload_optimizer.cpuadam_cores_perc), "cores of super_offload's CPU Adam; threads sets shardlm's")
          .within(0, 1),
      key(D, "zero_optimization.offload_param.device", FIELD(zero.offload_param.device),
          "parameter offload (ZeRO-Infinity), ZeRO stage 3 only: nvme keeps the compute-dtype shards of the sharded "
          "units in files under nvme_path, read ahead of each unit's gather inside the prefetch window and written "
          "back by the step; cpu on a CPU run is accepted, the parameters already live in host memory; on a CUDA "
          "run both keep the shards in pinned host memory (nvme: files read through host bounce buffers), copied "
          "up into the gather buffers inside the prefetch window (not yet run on a GPU); with pipeline or expert "
          "parallelism every engine (each stage's, the experts') offloads its own units")
          .choice("none").choice("cpu").choice("nvme"),
      key(D, "zero_optimization.offload_param.nvme_path", FIELD(zero.offload_param.nvme_path),
          "with device nvme: the directory of the parameter files (a local disk; checked before training: exists, "
          "writable, room for the files)"),
      key(D, "zero_optimization.offload_param.buffer_count", FIELD(zero.offload_param.buffer_count),
          "with device nvme: parameter shards in memory at once while the optimizer step streams them (>= 2)")
          .at_least(0),
      key(D, "zero_optimization.offload_param.buffer_size", FIELD(zero.offload_param.buffer_size),
          "with device nvme: elements of the largest unit shard allowed (as DeepSpeed, every shard must fit one "
          "buffer; a larger one is refused naming it)")
          .at_least(0),
      key(D, "zero_optimization.offload_param.max_in_cpu", FIELD(zero.offload_param.max_in_cpu),
          "with device nvme: elements of the first sharded units' shards kept in host memory (DeepSpeed's meaning; "
          "its default 1e9 keeps a small model wholly in memory: set 0 to offload every sharded unit)")
          .at_least(0),
      key(NOEFFECT, "zero_optimization.offload_param.pin_memory", FIELD(zero.offload_param.pin_memory),
          "page-locked host buffers for GPU copies; a CPU run copies nothing"),
      offload_flag("zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device",
                   [](TrainConfig& c) -> std::string& { return c.zero.offload_optimizer.device; }),
      offload_flag("zero_optimization.cpu_offload_params", "zero_optimization.offload_param.device",
                   [](TrainConfig& c) -> std::string& { return c.zero.offload_param.device; }),
      offload_flag("zero_optimization.cpu_offload_param", "zero_optimization.offload_param.device",
                   [](TrainConfig& c) -> std::string& { return c.zero.offload_param.device; }),
      noted<bool>("zero_optimization.cpu_offload_use_pin_memory",
                  "older pin_memory of both offloads; a CPU run copies nothing"),
      refused("zero_optimization.zenflow", "object", [](const json&) { return false; }, "absent",
              "ZenFlow is not implemented",
              "ZenFlow (stale, top-k selective optimizer updates) changes the update arithmetic and is not "
              "implemented in shardlm; remove it"),
      refused("zero_optimization.zero_quantized_weights", "bool", is_false, "false", "ZeRO++ qwZ is not implemented",
              "quantized weight communication (ZeRO++ qwZ) is not implemented in shardlm; remove it"),
      refused("zero_optimization.zero_quantized_gradients", "bool", is_false, "false", "ZeRO++ qgZ is not implemented",
              "quantized gradient communication (ZeRO++ qgZ) is not implemented in shardlm; remove it"),
      refused("zero_optimization.zero_quantized_nontrainable_weights", "bool", is_false, "false",
              "ZeRO++ quantized non-trainable weights are not implemented",
              "quantized non-trainable weights (ZeRO++) are not implemented in shardlm; remove it"),
      refused("zero_optimization.zero_hpz_partition_size", "integer",
              [](const json& v) { return v.is_number() && v.get<double>() <= 1; }, "<= 1 (1: no hpZ)",
              "ZeRO++ hpZ is not implemented",
              "hierarchical secondary partitions (ZeRO++ hpZ) are not implemented in shardlm; remove it"),
      refused("zero_optimization.zeropp_loco_param", "object", [](const json&) { return false; }, "absent",
              "LoCo-ZeRO++ is not implemented (DeepSpeed 0.19.8 removed it)",
              "LoCo error feedback for ZeRO++ quantized gradients is not implemented in shardlm, and DeepSpeed "
              "0.19.8 removed it; remove it"),
      key(D, "zero_optimization.mics_shard_size", FIELD(zero.mics_shard_size),
          "MiCS: ZeRO-3 shards within groups of this many data-parallel ranks and replicates across them, as "
          "parallelism.hybrid_shard with that shard_group_size (Hybrid sharding); <= 0: off")
          .hint("-1: off")
          // DeepSpeed 0.19.8 removed MiCS and refuses the key, so train_config.json names it only when on.
          .written_if([](const TrainConfig& c) { return c.zero.mics_shard_size > 0; }),
      refused("zero_optimization.mics_hierarchical_params_gather", "bool", is_false, "false",
              "MiCS is not implemented", "MiCS hierarchical gathers are not implemented in shardlm; remove it"),

      key(D, "bf16.enabled", FIELD(bf16), "bf16 compute (ZeRO and mixed precision)"),
      key(OWN, "bf16.cpu_products", FIELD(bf16_cpu_products),
          "bf16 matrix products on CPU; auto: the library's bf16 GEMM where the CPU has AVX-512 BF16, else fp32 "
          "products rounded once")
          .choice("auto").choice("native").choice("fp32"),
      key(D, "fp16.enabled", FIELD(fp16.enabled), "fp16 compute with loss scaling"),
      key(D, "fp16.loss_scale", FIELD(fp16.loss_scale), "fixed loss scale; 0: dynamic")
          .at_least(0).hint("0 = dynamic").only_if(fp16_on, "with fp16.enabled"),
      key(D, "fp16.initial_scale_power", FIELD(fp16.initial_scale_power), "dynamic scaling starts at 2^power")
          .within(0, 64).hint("the first scale is 2^power").only_if(fp16_on, "with fp16.enabled"),
      key(D, "fp16.loss_scale_window", FIELD(fp16.loss_scale_window), "steps without overflow before the scale grows")
          .at_least(1).only_if(fp16_on, "with fp16.enabled"),
      key(D, "fp16.hysteresis", FIELD(fp16.hysteresis), "overflows tolerated before the scale shrinks")
          .at_least(1).only_if(fp16_on, "with fp16.enabled"),
      key(D, "fp16.min_loss_scale", FIELD(fp16.min_loss_scale), "the dynamic scale's floor")
          .above(0).only_if(fp16_on, "with fp16.enabled"),
      key(OWN, "fp16.per_unit_loss_scaling", FIELD(fp16.per_unit_loss_scaling),
          "one scale per unit, from that unit's own gradient magnitudes, capped at max_loss_scale"),
      key(OWN, "fp16.max_loss_scale", FIELD(fp16.max_loss_scale), "per-unit scaling's cap (2^24)"),
      only("fp16.consecutive_hysteresis", false, "resetting hysteresis after every good step is not implemented",
           "the scaler restores its hysteresis only when the scale grows (DeepSpeed's default); resetting it after "
           "every step without overflow (consecutive_hysteresis=true) is not implemented. Set it to false or remove "
           "it"),
      noted<bool>("fp16.auto_cast",
                  "casts floating-point forward inputs to fp16; a language model's inputs are token ids, which it "
                  "leaves alone (DeepSpeed's engine._cast_inputs_half)"),
      key(D, "data_types.grad_accum_dtype", FIELD(grad_accum_dtype), "dtype of the persistent ZeRO gradient shard")
          .choice("fp32").choice("bf16"),
      key(OWN, "activation_checkpointing.mode", FIELD(activation_checkpointing.mode),
          "recompute in backward instead of keeping (Activation checkpointing)")
          .choice("none").choice("full").choice("selective"),
      noted<bool>("activation_checkpointing.partition_activations",
                  "DeepSpeed's checkpointing API (deepspeed.checkpointing), which a model calls itself; shardlm's "
                  "recompute is activation_checkpointing.mode"),
      noted<bool>("activation_checkpointing.contiguous_memory_optimization",
                  "deepspeed.checkpointing's buffer layout; recompute is activation_checkpointing.mode"),
      noted<bool>("activation_checkpointing.cpu_checkpointing",
                  "deepspeed.checkpointing's host copies; recompute is activation_checkpointing.mode"),
      noted<int64_t>("activation_checkpointing.number_checkpoints",
                     "deepspeed.checkpointing's buffer count; recompute is activation_checkpointing.mode"),
      noted<bool>("activation_checkpointing.synchronize_checkpoint_boundary",
                  "deepspeed.checkpointing's synchronization; recompute is activation_checkpointing.mode"),
      noted<bool>("activation_checkpointing.profile", "deepspeed.checkpointing's timers"),
      key(OWN, "parallelism.tensor_parallel", FIELD(parallelism.tensor_parallel),
          "Megatron column/row split of every layer over adjacent ranks; dp = ranks / (tp × pp)")
          .at_least(1),
      key(OWN, "parallelism.sequence_parallel", FIELD(parallelism.sequence_parallel),
          "with tensor_parallel > 1: norms and residuals split along the sequence"),
      key(OWN, "parallelism.pipeline_parallel", FIELD(parallelism.pipeline_parallel),
          "stages of consecutive layers (Pipeline parallelism)")
          .at_least(1),
      key(OWN, "parallelism.pipeline_schedule", FIELD(parallelism.pipeline_schedule), "pipeline schedule")
          .choice("gpipe").choice("1f1b").choice("interleaved_1f1b").choice("zb_h1"),
      key(OWN, "parallelism.virtual_pipeline_parallel", FIELD(parallelism.virtual_pipeline_parallel),
          "model chunks per pipeline rank for interleaved_1f1b (Megatron's virtual_pipeline_model_parallel_size); "
          "rank s holds chunks s, s + p, ...")
          .at_least(1),
      key(OWN, "parallelism.hybrid_shard", FIELD(parallelism.hybrid_shard),
          "ZeRO stages 1-3 shard within groups of shard_group_size data-parallel ranks and replicate across "
          "groups, gradients all-reduced between them (FSDP's HYBRID_SHARD; Hybrid sharding)"),
      key(OWN, "parallelism.shard_group_size", FIELD(parallelism.shard_group_size),
          "with hybrid_shard: data-parallel ranks per shard group, a divisor of the data-parallel size")
          .at_least(0).hint("0: the data-parallel ranks of one node"),
      key(OWN, "parallelism.expert_parallel", FIELD(parallelism.expert_parallel),
          "mixture-of-experts models: each sparse layer's experts split over this many data-parallel ranks, tokens "
          "sent to them by all_to_all (Megatron's expert_model_parallel_size; Expert parallelism)")
          .at_least(1),
      key(OWN, "parallelism.pipeline_split", FIELD(parallelism.pipeline_split),
          "decoder layers per stage; empty: the split whose busiest stage computes least (a layer costing its matrix "
          "products, the head its vocabulary product)"),

      // DeepSpeed's other sections: the older names it still reads, and what cannot change the arithmetic
      // (accepted with a notice), or would and is not built (refused).
      alias("tensor_parallel.autotp_size", "parallelism.tensor_parallel"),
      alias("steps_per_print", "log_interval"),
      noted<bool>("wall_clock_breakdown", "DeepSpeed's step timers; metrics.jsonl always holds the step's phase times"),
      noted<bool>("memory_breakdown", "DeepSpeed's memory printout; metrics.jsonl holds the step's memory"),
      noted<bool>("prescale_gradients",
                  "divides gradients by the ranks before the all-reduce instead of after: the same mean"),
      noted<double>("gradient_predivide_factor", "splits the division by the ranks around the all-reduce: the same mean"),
      noted<bool>("zero_allow_untested_optimizer",
                  "DeepSpeed's guard for optimizers its ZeRO has not tested; shardlm refuses Lamb with ZeRO itself"),
      noted<bool>("zero_force_ds_cpu_optimizer", "which CPU Adam kernel DeepSpeed's offload uses; the same arithmetic"),
      noted<std::string>("seq_parallel_communication_data_type",
                         "dtype of DeepSpeed-Ulysses sequence-parallel all-to-alls; shardlm has no Ulysses"),
      noted<bool>("dump_state", "DeepSpeed's printout of its state"),
      noted<bool>("dataloader_drop_last", "DeepSpeed's own data loader; shardlm's reads windows of data.train"),
      noted<bool>("compile.disable", "torch.compile of the model; shardlm does not compile it"),
      noted<std::string>("compile.backend", "torch.compile's backend; shardlm does not compile the model"),
      noted<bool>("compile.deepcompile", "DeepSpeed's compiler passes; shardlm does not compile the model"),
      noted<bool>("flops_profiler.enabled", "DeepSpeed's FLOPs profiler; metrics.jsonl holds tokens per second"),
      noted<double>("flops_profiler.recompute_fwd_factor", "the profiler's recompute accounting"),
      noted<int64_t>("flops_profiler.profile_step", "the profiler's step"),
      noted<int64_t>("flops_profiler.module_depth", "the profiler's depth"),
      noted<int64_t>("flops_profiler.top_modules", "the profiler's listing"),
      noted<bool>("flops_profiler.detailed", "the profiler's listing"),
      noted<std::string>("flops_profiler.output_file", "the profiler's file"),
      noted<bool>("comms_logger.enabled", "DeepSpeed's collective logger; bench comm and the flight recorder are shardlm's"),
      noted<bool>("comms_logger.verbose", "the collective logger's printout"),
      noted<bool>("comms_logger.prof_all", "the collective logger's selection"),
      noted<std::vector<std::string>>("comms_logger.prof_ops", "the collective logger's selection"),
      noted<bool>("comms_logger.debug", "the collective logger's printout"),
      noted<int64_t>("aio.block_size", kAio),
      noted<int64_t>("aio.queue_depth", kAio),
      noted<int64_t>("aio.intra_op_parallelism", kAio),
      noted<int64_t>("aio.thread_count", kAio),
      noted<bool>("aio.single_submit", kAio),
      noted<bool>("aio.overlap_events", kAio),
      noted<bool>("aio.use_gds", kAio),
      key(D, "tensorboard.enabled", FIELD(tensorboard.enabled),
          "the logging rank writes TensorBoard event files of every metrics.jsonl field (train/loss, "
          "train/learning_rate, ...; docs/monitoring.md) in output_path/job_name"),
      key(D, "tensorboard.output_path", FIELD(tensorboard.output_path),
          "the TensorBoard monitor's directory; empty: the working directory"),
      key(D, "tensorboard.job_name", FIELD(tensorboard.job_name),
          "the TensorBoard monitor's folder inside output_path ('/' nests folders; '..' refused)"),
      noted<bool>("wandb.enabled", kNotWritten("a Weights & Biases", "`wandb sync --sync-tensorboard DIR` uploads them")),
      noted<std::string>("wandb.group", "the W&B monitor's group"),
      noted<std::string>("wandb.team", "the W&B monitor's team"),
      noted<std::string>("wandb.project", "the W&B monitor's project"),
      key(D, "csv_monitor.enabled", FIELD(csv_monitor.enabled),
          "the logging rank writes DeepSpeed's CSV files, one per tag (train_loss.csv: step,loss), in "
          "output_path/job_name"),
      key(D, "csv_monitor.output_path", FIELD(csv_monitor.output_path),
          "the CSV monitor's directory; empty: the working directory"),
      key(D, "csv_monitor.job_name", FIELD(csv_monitor.job_name),
          "the CSV monitor's folder inside output_path ('/' nests folders; '..' refused)"),
      noted<bool>("comet.enabled", kNotWritten("a Comet", "TensorBoard shows them while the run trains")),
      noted<int64_t>("comet.samples_log_interval", "the Comet monitor's interval"),
      noted<std::string>("comet.project", "the Comet monitor's project"),
      noted<std::string>("comet.workspace", "the Comet monitor's workspace"),
      noted<std::string>("comet.api_key", "the Comet monitor's key"),
      noted<std::string>("comet.experiment_name", "the Comet monitor's run name"),
      noted<std::string>("comet.experiment_key", "the Comet monitor's run key"),
      noted<bool>("comet.online", "the Comet monitor's mode"),
      noted<std::string>("comet.mode", "the Comet monitor's mode"),
      noted<bool>("compile.autoep_non_moe", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.free_activation", kDeepCompileMemory),
      noted<int64_t>("compile.free_activation_threshold", kDeepCompileMemory),
      noted<bool>("compile.offload_activation", kDeepCompileMemory),
      noted<bool>("compile.offload_activation_pin_memory", kDeepCompileMemory),
      noted<bool>("compile.offload_opt_states", kDeepCompileMemory),
      noted<bool>("compile.double_buffer", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.symmetric_memory", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.debug_log", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.offload_parameters", kDeepCompileMemory),
      noted<bool>("compile.sync_before_reduce", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.sync_after_reduce", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.sync_before_allgather", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.sync_after_allgather", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.keep_int_input_tensors", "a DeepCompile option; shardlm does not compile the model"),
      noted<bool>("compile.keep_all_input_tensors", "a DeepCompile option; shardlm does not compile the model"),
      noted<std::vector<std::string>>("compile.passes", "DeepCompile's passes; shardlm does not compile the model"),
      noted_section("checkpoint",
                    "DeepSpeed's checkpoint engine (tag validation, universal loading, node-local storage, writer); "
                    "shardlm's sharded checkpoints are checkpoint_interval, checkpoint_keep, checkpoint_async"),
      noted_section("autotuning", "DeepSpeed's autotuner, which launches trial runs itself; `shardlm plan --search` is "
                                  "shardlm's"),
      noted_section("timers", "DeepSpeed's throughput timer; metrics.jsonl holds tokens per second"),
      noted_section("datastates_ckpt", "DataStates asynchronous checkpointing; shardlm's is checkpoint_async"),
      noted_section("pipeline",
                    "DeepSpeed's PipelineModule settings, which a model's code passes itself; shardlm's pipeline is "
                    "parallelism.pipeline_parallel, pipeline_split and pipeline_schedule"),
      noted_section("hybrid_engine",
                    "DeepSpeed-Chat's switch to inference kernels for generation; the training step is unchanged"),
      noted_section("zero_optimization.leaf_module",
                    "ZeRO-3 modules gathered as one unit (MoE blocks); shardlm gathers per layer unit"),
      noted<double>("allgather_size",
                    "read only under the oldest form `zero_optimization: true` (its allgather_bucket_size, "
                    "config_deepspeed.cpp); DeepSpeed ignores it otherwise"),
      older_section("bfloat16", "bf16"),
      noted<bool>("disable_allgather", "DeepSpeed's legacy switch of a gather path; the same values"),
      noted<bool>("disable_python_gc", "Python's garbage collector; shardlm is C++"),
      noted<std::string>("log_level", "DeepSpeed's logger level"),
      noted<double>("vocabulary_size", "DeepSpeed only warns when it is not a multiple of 8; the model section "
                                       "holds the vocabulary"),
      noted<bool>("use_data_before_expert_parallelism",
                  "the order of data- and expert-parallel ranks in DeepSpeed's process groups; the same arithmetic"),
      noted<bool>("optimizer.legacy_fusion", "DeepSpeed's older fused fp16 optimizer wrapper; the same update"),
      noted<bool>("optimizer.params.foreach", "torch_adam's multi-tensor kernels; the same arithmetic"),
      only("managed_gradient_accumulation", true, "accumulation boundaries the caller manages are not built",
           "shardlm runs gradient_accumulation_steps micro-steps per optimizer step itself; boundaries the model's "
           "code manages (managed_gradient_accumulation=false) are not implemented. Set it to true or remove it"),
      only("gradient_allreduce_op", "mean", "summed gradients (sum) are not implemented",
           "shardlm averages gradients over the data-parallel ranks; summing them (gradient_allreduce_op=\"sum\") "
           "changes the update and is not implemented. Set it to \"mean\" or remove it"),
      refused("sequence_parallel_size", "integer", [](const json& v) { return v.is_number() && v.get<double>() == 1; },
              "1", "DeepSpeed-Ulysses sequence parallelism is not implemented",
              "DeepSpeed-Ulysses sequence parallelism (all-to-all over the sequence) is not implemented in shardlm; "
              "set it to 1 or remove it (shardlm's sequence split is parallelism.sequence_parallel with tensor "
              "parallelism)"),
      refused("communication_data_type", "string", [](const json&) { return false; }, "absent",
              "the dtype of gradient reductions is not configurable",
              "choosing the dtype gradients are reduced in is not implemented in shardlm, and a lower one changes "
              "the sums; remove it"),
      refused_section("torch_autocast", "torch.autocast mixed precision is not implemented",
                      "torch.autocast's per-operator mixed precision is not implemented in shardlm; use bf16.enabled "
                      "or fp16.enabled, or set torch_autocast.enabled false"),
      refused_section("weight_quantization", "quantized weights are not implemented",
                      "quantized weights change the arithmetic and are not implemented in shardlm; remove the "
                      "section or set \"enabled\": false (DeepSpeed's default is true)"),
      refused_section("expert_parallel", "DeepSpeed's AutoEP is not implemented",
                      "AutoEP replaces a model's MoE layers with its own routed experts, which shardlm does not "
                      "implement; remove it or set \"enabled\": false (shardlm splits the experts of the model's own "
                      "MoE layers with parallelism.expert_parallel)"),
      // DeepSpeed's bf16 masters, read onto shardlm's keys by resolve_deepspeed_values (config_deepspeed.cpp)
      // and refused where DeepSpeed refuses them or shardlm has no equivalent (config_ranges.cpp).
      key(D, "bf16.bf16_master_weights_and_grads", FIELD(bf16_master_weights_and_grads),
          "DeepSpeed's bf16 masters (its ZeRO-Offload CPU Adam, one rounding to nearest per step): true sets "
          "optimizer.master_precision \"bf16\", master_rounding \"nearest\" and, unless given, "
          "data_types.grad_accum_dtype \"bf16\" (the step sees bf16 gradients); ZeRO stages 1-3, bf16.enabled, "
          "Adam/AdamW without torch_adam (bf16 master weights)"),
      key(D, "bf16.bf16_optimizer_states", FIELD(bf16_optimizer_states),
          "DeepSpeed's bf16 Adam moments, with bf16_master_weights_and_grads only (as DeepSpeed): true sets "
          "optimizer.state_precision \"bf16\""),
      noted<bool>("bf16.immediate_grad_update",
                  "when DeepSpeed's bf16 optimizer adds micro-step gradients into fp32; shardlm accumulates them in "
                  "data_types.grad_accum_dtype"),
      noted<bool>("bf16.check_grad_overflow",
                  "DeepSpeed's overflow check of bf16 gradients; shardlm checks every step's loss and gradient norm "
                  "for non-finite values itself"),
      refused("fp16.fp16_master_weights_and_grads", "bool", is_false, "false", "fp16 masters are not implemented",
              "fp16 master weights and gradients are not implemented in shardlm (fp16 runs keep fp32 masters); set "
              "it to false or remove it"),
      custom(NOEFFECT, "data_types.param_dtype", "string",
             "DeepSpeed's check of the parameters' dtype: it must be the run's (bf16.enabled: bf16, fp16.enabled: "
             "fp16, else fp32), as DeepSpeed asserts",
             [](const json& v) { return json_type_problem<std::string>(v); },
             [](TrainConfig& c, const json& v) {
               const std::string dtype = dtype_name(v.get<std::string>()), run = precision_of(c).name;
               if (dtype.empty()) fail("data_types.param_dtype = ", v.dump(), ": must be \"fp16\", \"bf16\" or \"fp32\"");
               if (dtype != run)
                 fail("data_types.param_dtype = ", v.dump(), " conflicts with this run's ", run, " parameters "
                      "(bf16.enabled / fp16.enabled); set it to \"", run, "\" or remove it, as DeepSpeed requires");
             },
             nullptr),
      refused("data_types.buffer_dtype", "string", [](const json&) { return false; }, "absent",
              "casting module buffers is not implemented",
              "casting a model's buffers to another dtype is not implemented in shardlm; remove it"),
      refused("data_types.keep_in_fp32_modules", "string", [](const json& v) { return v == "auto"; }, "\"auto\"",
              "naming modules kept in fp32 is not implemented",
              "keeping named modules' buffers in fp32 is not implemented in shardlm; set it to \"auto\" "
              "(DeepSpeed's default) or remove it"),
      noted<bool>("tensor_parallel.tp_overlap_comm", "overlap of AutoTP's all-reduces; the same sums"),
      noted<bool>("tensor_parallel.vocab_parallel_lm_head", "how AutoTP splits the head; the same logits"),
      noted<std::string>("tensor_parallel.vocab_parallel_ce_backend", "AutoTP's loss kernel; the same loss"),
      noted<bool>("tensor_parallel.keep_module_on_host", "where AutoTP loads modules; the same weights"),
      noted<std::string>("tensor_parallel.preset_model",
                         "AutoTP's layer split of a known model; shardlm splits a Llama's layers its own way "
                         "(Megatron column/row), the same arithmetic"),
      noted_section("tensor_parallel.partition_config",
                    "AutoTP's custom layer split; shardlm splits a Llama's layers its own way (Megatron column/row)"),
      refused("tensor_parallel.dtype", "string", [](const json&) { return false; }, "absent",
              "AutoTP's dtype is not read",
              "AutoTP's layer dtype is not implemented in shardlm; remove it (the compute dtype is bf16.enabled / "
              "fp16.enabled)"),
      only("tensor_parallel.replace_with_kernel_inject", false, "inference kernels are not implemented",
           "DeepSpeed's inference kernels are not implemented in shardlm; set it to false or remove it"),
      only("tensor_parallel.kernel_inject", false, "inference kernels are not implemented",
           "DeepSpeed's inference kernels are not implemented in shardlm; set it to false or remove it"),
      refused("tensor_parallel.tp", "object",
              [](const json& v) { return v.is_object() && (!v.contains("tp_size") || v["tp_size"] == 1) &&
                                         v.size() <= (v.contains("tp_size") ? 1u : 0u) + (v.contains("tp_grain_size") ? 1u : 0u); },
              "{\"tp_size\": 1}", "DeepSpeed's inference TP size; training's is autotp_size",
              "DeepSpeed's inner tensor-parallel section (tp_size) is its inference size; shardlm's tensor "
              "parallelism is tensor_parallel.autotp_size or parallelism.tensor_parallel. Set tp_size 1 or remove it"),
      refused("tensor_parallel.tensor_parallel", "object",
              [](const json& v) { return v.is_object() && (!v.contains("tp_size") || v["tp_size"] == 1) &&
                                         v.size() <= (v.contains("tp_size") ? 1u : 0u) + (v.contains("tp_grain_size") ? 1u : 0u); },
              "{\"tp_size\": 1}", "DeepSpeed's inference TP size; training's is autotp_size",
              "DeepSpeed's inner tensor-parallel section (tp_size) is its inference size; shardlm's tensor "
              "parallelism is tensor_parallel.autotp_size or parallelism.tensor_parallel. Set tp_size 1 or remove it"),
      noted<bool>("zero_optimization.allgather_sequential", "ZeRO-3 gathers one parameter at a time; the same values"),
      noted<bool>("zero_optimization.stage3_allgather_sequential",
                  "ZeRO-3 gathers one parameter at a time; the same values"),
      noted<bool>("zero_optimization.use_all_reduce_for_fetch_params",
                  "ZeRO-3 gathers by all-reduce instead of all-gather; the same values"),
      noted<bool>("zero_optimization.stage3_use_all_reduce_for_fetch_params",
                  "ZeRO-3 gathers by all-reduce instead of all-gather; the same values"),
      noted<int64_t>("zero_optimization.module_granularity_threshold",
                     "ZeRO-3 fetches small modules as one; shardlm gathers per layer unit"),
      noted<int64_t>("zero_optimization.stage3_module_granularity_threshold",
                     "ZeRO-3 fetches small modules as one; shardlm gathers per layer unit"),
      noted<bool>("zero_optimization.use_multi_rank_bucket_allreduce",
                  "DeepSpeed's choice of reduce collectives; the same sums"),
      noted<bool>("zero_optimization.compute_grad_norm",
                  "whether ZeRO 1/2 computes the gradient norm; shardlm computes it for clipping and metrics.jsonl"),
      only("zero_optimization.load_from_fp32_weights", true, "masters from 16-bit weights are not implemented",
           "shardlm's checkpoints restore the fp32 masters themselves; initializing them from the 16-bit weights "
           "(load_from_fp32_weights=false) loses precision and is not implemented. Set it to true or remove it"),
      noted<bool>("zero_optimization.elastic_checkpoint", "DeepSpeed's legacy checkpoint layout; shardlm's reshard"),
      noted<bool>("zero_optimization.legacy_stage1", "DeepSpeed's older stage-1 code; the same update"),
      noted<bool>("zero_optimization.parameter_alignment", "padding in DeepSpeed's flat buffers; the same values"),
      noted<bool>("zero_optimization.memory_efficient_linear",
                  "a ZeRO-3 linear that frees its gathered weight early; the same products"),
      noted<bool>("zero_optimization.pipeline_loading_checkpoint", "how DeepSpeed loads a ZeRO-3 checkpoint"),
      noted<bool>("zero_optimization.override_module_apply", "ZeRO-3's hook on nn.Module.apply; shardlm is C++"),
      noted<bool>("zero_optimization.log_trace_cache_warnings", "ZeRO-3's trace-cache logging"),
      noted<bool>("zero_optimization.enable_sanity_checks", "ZeRO-3's internal checks"),
      noted<bool>("zero_optimization.save_muon_momentum_buffer_in_memory",
                  "Muon's momentum under NVMe offload; shardlm has no Muon (optimizer.type refuses it)"),
      refused("scheduler.params.lr_range_test_min_lr", "number", [](const json&) { return false; }, "absent",
              "LRRangeTest is not implemented", kNoLrRangeTest),
      refused("scheduler.params.lr_range_test_step_size", "integer", [](const json&) { return false; }, "absent",
              "LRRangeTest is not implemented", kNoLrRangeTest),
      refused("scheduler.params.lr_range_test_step_rate", "number", [](const json&) { return false; }, "absent",
              "LRRangeTest is not implemented", kNoLrRangeTest),
      refused("scheduler.params.lr_range_test_staircase", "bool", [](const json&) { return false; }, "absent",
              "LRRangeTest is not implemented", kNoLrRangeTest),
      refused("scheduler.params.cycle_min_lr", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_max_lr", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.decay_lr_rate", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_first_step_size", "integer", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_second_step_size", "integer", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_first_stair_count", "integer", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_second_stair_count", "integer", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.decay_step_size", "integer", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_momentum", "bool", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_min_mom", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.cycle_max_mom", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused("scheduler.params.decay_mom_rate", "number", [](const json&) { return false; }, "absent",
              "OneCycle is not implemented", kNoOneCycle),
      refused_section("elasticity", "elastic training is not implemented (DeepSpeed 0.19.8 removed it)",
                      "elastic training (batch sizes chosen for a changing number of GPUs) is not implemented in "
                      "shardlm, and DeepSpeed 0.19.8 removed it; set train_batch_size, train_micro_batch_size_per_gpu "
                      "and gradient_accumulation_steps directly, or set \"enabled\": false"),
      refused_section("nebula", "Nebula checkpointing is not implemented (DeepSpeed 0.19.8 removed it)",
                      "Nebula checkpointing is not implemented in shardlm, and DeepSpeed 0.19.8 removed it; shardlm's "
                      "checkpoints are checkpoint_interval and checkpoint_async. Remove it or set \"enabled\": false"),
      refused_section("eigenvalue", "eigenvalue-based MoQ is not implemented (DeepSpeed 0.19.8 removed it)",
                      "eigenvalue-based quantization schedules are not implemented in shardlm, and DeepSpeed 0.19.8 "
                      "removed them; remove it or set \"enabled\": false"),
      refused_section("quantize_training", "quantized training (MoQ) is not implemented (DeepSpeed 0.19.8 removed it)",
                      "Mixture-of-Quantization training changes the arithmetic and is not implemented in shardlm, and "
                      "DeepSpeed 0.19.8 removed it; remove it or set \"enabled\": false"),
      refused_section("compression_training", "the compression library is not implemented (DeepSpeed 0.19.8 removed it)",
                      "DeepSpeed's compression library (quantization, pruning) changes the arithmetic and is not "
                      "implemented in shardlm, and DeepSpeed 0.19.8 removed it; remove the section",
                      /*can_disable=*/false),
      only("sparse_gradients", false, "sparse embedding gradients are not implemented (DeepSpeed 0.19.8 removed it)",
           "sparse embedding-gradient reduction is not implemented in shardlm, and DeepSpeed 0.19.8 removed it; set it "
           "to false or remove it"),
      only("graph_harvesting", false, "graph harvesting is not implemented (DeepSpeed 0.19.8 removed it)",
           "CUDA-graph harvesting is not implemented in shardlm, and DeepSpeed 0.19.8 removed it; set it to false or "
           "remove it"),
      refused_section("sparse_attention", "sparse attention is not implemented",
                      "block-sparse attention changes the attention arithmetic and is not implemented in shardlm; "
                      "remove the section (shardlm computes dense causal attention)",
                      /*can_disable=*/false),
      refused_section("progressive_layer_drop", "progressive layer dropping is not implemented",
                      "progressive layer dropping skips layers at random and is not implemented in shardlm; remove "
                      "it or set \"enabled\": false"),
      refused_section("amp", "apex AMP is not implemented",
                      "apex AMP's mixed precision is not implemented in shardlm; use bf16.enabled or fp16.enabled, "
                      "or set amp.enabled false"),
      refused_section("curriculum_learning", "curriculum learning is not implemented",
                      "curriculum learning changes the batches and is not implemented in shardlm; remove it or set "
                      "\"enabled\": false"),
      refused_section("data_efficiency", "data efficiency (data routing, curriculum) is not implemented",
                      "DeepSpeed's data efficiency library changes the batches and is not implemented in shardlm; "
                      "remove it or set \"enabled\": false"),
  };
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
#undef FIELD

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
