// The training config's keys, one row each (config_keys.h says what derives from them). A row names
// its TrainConfig field through FIELD(...), whose type gives the key's JSON type check; the field's
// initializer in config.h is the key's default. Rows are in the order each section lists its
// valid keys in an unknown-key error.
#include "train/config_keys.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "model/llama_config.h"
#include "plan/planner.h"
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

bool offload_off(const json& v) {  // false, {} or {"device": "none"}: no offload
  return v == false || (v.is_object() && (!v.contains("device") || v["device"] == "none"));
}
bool is_false(const json& v) { return v == false; }

bool fp16_on(const TrainConfig& c) { return c.fp16.enabled; }

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
  const auto D = DeepSpeed::Same, OWN = DeepSpeed::None, NOEFFECT = DeepSpeed::NoEffect;
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

      key(D, "optimizer.type", FIELD(optimizer.type), "the optimizer").choice("AdamW").choice("adamw", "the same")
          .written_as([](const TrainConfig&) { return json("AdamW"); }),
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
          "decoupled weight decay, applied to tensors with >= 2 dimensions")
          .at_least(0),

      key(D, "scheduler.type", FIELD(scheduler.type), "learning-rate schedule; WarmupCosineLR's formula ends DeepSpeed configs")
          .choice("constant").choice("WarmupCosineLR", "linear warm-up, then cosine decay"),
      key(D, "scheduler.params.warmup_num_steps", FIELD(scheduler.warmup_num_steps), "WarmupCosineLR's W")
          .at_least(0),
      key(D, "scheduler.params.warmup_min_ratio", FIELD(scheduler.warmup_min_ratio),
          "WarmupCosineLR's r0: warm-up starts at lr × r0")
          .within(0, 1),
      key(D, "scheduler.params.cos_min_ratio", FIELD(scheduler.cos_min_ratio),
          "WarmupCosineLR's rmin: decay ends at lr × rmin")
          .within(0, 1),
      key(D, "scheduler.params.total_num_steps", FIELD(scheduler.total_num_steps), "WarmupCosineLR's S")
          .at_least(0).hint("0: the run's steps"),

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
      key(NOEFFECT, "zero_optimization.sub_group_size", FIELD(zero.sub_group_size),
          "elements per optimizer-step tile; shardlm steps per unit")
          .above(0),
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
      refused("zero_optimization.offload_optimizer", "object", offload_off, "false, {} or {\"device\": \"none\"}",
              "optimizer-state offload (ZeRO-Offload) is not implemented",
              "optimizer-state offload to CPU/NVMe (ZeRO-Offload) is not implemented in shardlm; remove it, or use "
              "a higher zero_optimization.stage or more ranks to fit the optimizer state"),
      refused("zero_optimization.offload_param", "object", offload_off, "false, {} or {\"device\": \"none\"}",
              "parameter offload (ZeRO-Infinity) is not implemented",
              "parameter offload to CPU/NVMe (ZeRO-Infinity) is not implemented in shardlm; remove it, or use "
              "zero_optimization.stage 3 with more ranks"),
      refused("zero_optimization.cpu_offload", "bool", offload_off, "false", "CPU offload (ZeRO-Offload) is not implemented",
              "CPU offload (ZeRO-Offload) is not implemented in shardlm; remove it"),
      refused("zero_optimization.cpu_offload_params", "bool", offload_off, "false",
              "parameter offload (ZeRO-Infinity) is not implemented",
              "parameter offload (ZeRO-Infinity) is not implemented in shardlm; remove it"),
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
      key(D, "zero_optimization.mics_shard_size", FIELD(zero.mics_shard_size),
          "MiCS: ZeRO-3 shards within groups of this many data-parallel ranks and replicates across them, as "
          "parallelism.hybrid_shard with that shard_group_size (Hybrid sharding); <= 0: off")
          .hint("-1: off"),
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
      only("fp16.auto_cast", false, "shardlm runs the whole model in fp16; auto_cast=true is not implemented",
           "shardlm runs the whole model in fp16 (inputs included); auto_cast=true is not implemented. Set it to false "
           "or remove it"),
      key(D, "data_types.grad_accum_dtype", FIELD(grad_accum_dtype), "dtype of the persistent ZeRO gradient shard")
          .choice("fp32").choice("bf16"),
      key(OWN, "activation_checkpointing.mode", FIELD(activation_checkpointing.mode),
          "recompute in backward instead of keeping (Activation checkpointing)")
          .choice("none").choice("full").choice("selective"),
      key(OWN, "parallelism.tensor_parallel", FIELD(parallelism.tensor_parallel),
          "Megatron column/row split of every layer over adjacent ranks; dp = ranks / (tp × pp)")
          .at_least(1),
      key(OWN, "parallelism.sequence_parallel", FIELD(parallelism.sequence_parallel),
          "with tensor_parallel > 1: norms and residuals split along the sequence"),
      key(OWN, "parallelism.pipeline_parallel", FIELD(parallelism.pipeline_parallel),
          "stages of consecutive layers (Pipeline parallelism)")
          .at_least(1),
      key(OWN, "parallelism.pipeline_schedule", FIELD(parallelism.pipeline_schedule), "pipeline schedule")
          .choice("gpipe").choice("1f1b"),
      key(OWN, "parallelism.hybrid_shard", FIELD(parallelism.hybrid_shard),
          "ZeRO stages 1-3 shard within groups of shard_group_size data-parallel ranks and replicate across "
          "groups, gradients all-reduced between them (FSDP's HYBRID_SHARD; Hybrid sharding)"),
      key(OWN, "parallelism.shard_group_size", FIELD(parallelism.shard_group_size),
          "with hybrid_shard: data-parallel ranks per shard group, a divisor of the data-parallel size")
          .at_least(0).hint("0: the data-parallel ranks of one node"),
      key(OWN, "parallelism.pipeline_split", FIELD(parallelism.pipeline_split),
          "decoder layers per stage; empty: the split whose busiest stage computes least (a layer costing its matrix "
          "products, the head its vocabulary product)"),
  };
  // An alias reads and checks as the key it names; it is written once, under that key's name.
  for (auto& k : t)
    if (k.deepspeed == DeepSpeed::Alias)
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
