#include "train/config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/token_file.h"
#include "model/attention.h"
#include "model/fp32_products.h"
#include "model/recompute.h"
#include "model/rope.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/tensor/tp_layout.h"
#include "plan/planner.h"
#include "train/config_ranges.h"
#include "train/config_types.h"
#include "util/error.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

// Reads one JSON object section, remembering which keys were consumed so that leftovers can be
// reported as unknown together with the valid names.
class Section {
 public:
  Section(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) fail(where_, " must be a JSON object, got ", j_.dump());
  }
  template <typename T>
  void get(const std::string& key, T& dst) {
    valid_.push_back(key);
    if (!has(key)) return;
    check_type(key, j_.at(key), dst);
    try {
      dst = j_.at(key).get<T>();
    } catch (const std::exception&) {
      fail(where_, key_sep(), key, ": wrong type, got ", j_.at(key).dump());
    }
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // The sub-object at `key` (null when absent); registers the key as valid either way.
  const json& raw(const std::string& key) {
    static const json null_json;
    valid_.push_back(key);
    return has(key) ? j_.at(key) : null_json;
  }
  // A DeepSpeed key for a feature shardlm lacks: accepted while `harmless(value)` (e.g. false, or
  // {"device": "none"}), otherwise refused naming the feature, never reported as an unknown key.
  template <typename F>
  void unsupported(const std::string& key, F harmless, const std::string& why) {
    valid_.push_back(key);
    if (has(key) && !harmless(j_.at(key)))
      fail(where_, key_sep(), key, " = ", j_.at(key).dump(), ": ", why);
  }
  // A DeepSpeed key whose value must be `supported` (shardlm implements only that behaviour).
  void only(const std::string& key, const json& supported, const std::string& why) {
    unsupported(key, [&](const json& v) { return v == supported; }, why);
  }
  // Parses the sub-object at `key` (if present) with `parse`, then rejects its unknown keys.
  template <typename F>
  void section(const std::string& key, F parse) {
    const json& sub = raw(key);
    if (sub.is_null()) return;
    Section s(sub, where_ == "config" ? key : where_ + "." + key);
    parse(s);
    s.finish();
  }
  void finish() const {
    std::string valid;
    for (const auto& v : valid_) valid += (valid.empty() ? "" : ", ") + v;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(valid_.begin(), valid_.end(), it.key()) == valid_.end())
        fail("unknown config key '", where_ == "config" ? "" : where_ + ".", it.key(), "'. Valid keys",
             where_ == "config" ? "" : " in " + where_, ": ", valid);
  }

 private:
  // JSON's numbers carry no type, and nlohmann's get<int64_t>(2.5) truncates: an integer key must
  // hold an integral value, an unsigned one a non-negative one (config_types.h).
  template <typename T>
  void check_type(const std::string& key, const json& v, const T&) const {
    const std::string problem = json_type_problem<T>(v);
    if (!problem.empty()) fail(where_, key_sep(), key, ": ", problem, ", got ", v.dump());
  }
  std::string key_sep() const { return where_ == "config" ? " key " : "."; }
  const json& j_;
  std::string where_;
  std::vector<std::string> valid_;
};

void apply_override(json& root, const std::string& ov) {
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
    if (!node->contains(key) || !(*node)[key].is_object()) (*node)[key] = json::object();
    node = &(*node)[key];
    start = dot + 1;
  }
}

// Model fields as accepted back by the "model" section (HF keys minus the descriptive ones).
json model_fields_json(const model::LlamaConfig& m) {
  json j = model::to_hf_json(m);
  for (const char* k : {"architectures", "torch_dtype"}) j.erase(k);
  return j;
}

// DeepSpeed's other zero_optimization keys (https://www.deepspeed.ai/docs/config-json/), with
// DeepSpeed's meaning: the ones shardlm honours are stored, values asking for behaviour it lacks
// and keys of features it lacks are refused naming what is missing.
void read_deepspeed_zero_keys(Section& s, ZeroConfig& z) {
  s.only("allgather_partitions", true,
         "shardlm gathers updated parameters with one all-gather per unit; the broadcast-based gather "
         "(allgather_partitions=false) is not implemented. Set it to true or remove it");
  s.only("reduce_scatter", true,
         "shardlm reduces gradients with reduce-scatter; the all-reduce-based reduction (reduce_scatter=false) "
         "is not implemented. Set it to true or remove it");
  s.get("sub_group_size", z.sub_group_size);
  s.get("round_robin_gradients", z.round_robin_gradients);
  s.get("stage3_max_live_parameters", z.stage3_max_live_parameters);
  s.get("stage3_max_reuse_distance", z.stage3_max_reuse_distance);
  s.get("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  s.get("stage3_gather_fp16_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);  // older name
  s.get("ignore_unused_parameters", z.ignore_unused_parameters);
  const auto off = [](const json& v) {  // absent, false, {} or {"device": "none"}: no offload
    return v == false || (v.is_object() && (!v.contains("device") || v["device"] == "none"));
  };
  const auto is_false = [](const json& v) { return v == false; };
  const auto hpz_off = [](const json& v) { return v.is_number() && v.get<double>() <= 1; };   // 1: no hpZ
  const auto mics_off = [](const json& v) { return v.is_number() && v.get<double>() <= 0; };  // -1: no MiCS
  s.unsupported("offload_optimizer", off,
                "optimizer-state offload to CPU/NVMe (ZeRO-Offload) is not implemented in shardlm; remove it, or use "
                "a higher zero_optimization.stage or more ranks to fit the optimizer state");
  s.unsupported("offload_param", off,
                "parameter offload to CPU/NVMe (ZeRO-Infinity) is not implemented in shardlm; remove it, or use "
                "zero_optimization.stage 3 with more ranks");
  s.unsupported("cpu_offload", off, "CPU offload (ZeRO-Offload) is not implemented in shardlm; remove it");
  s.unsupported("cpu_offload_params", off, "parameter offload (ZeRO-Infinity) is not implemented in shardlm; remove it");
  s.unsupported("zero_quantized_weights", is_false,
                "quantized weight communication (ZeRO++ qwZ) is not implemented in shardlm; remove it");
  s.unsupported("zero_quantized_gradients", is_false,
                "quantized gradient communication (ZeRO++ qgZ) is not implemented in shardlm; remove it");
  s.unsupported("zero_quantized_nontrainable_weights", is_false,
                "quantized non-trainable weights (ZeRO++) are not implemented in shardlm; remove it");
  s.unsupported("zero_hpz_partition_size", hpz_off,
                "hierarchical secondary partitions (ZeRO++ hpZ) are not implemented in shardlm; remove it");
  s.unsupported("mics_shard_size", mics_off,
                "MiCS sub-group sharding is not implemented in shardlm; remove it");
  s.unsupported("mics_hierarchical_params_gather", is_false,
                "MiCS hierarchical gathers are not implemented in shardlm; remove it");
  if (z.sub_group_size <= 0) fail("zero_optimization.sub_group_size must be positive, got ", z.sub_group_size);
  if (z.stage3_max_live_parameters < 0 || z.stage3_max_reuse_distance < 0)
    fail("zero_optimization.stage3_max_live_parameters and stage3_max_reuse_distance must be >= 0");
}

}  // namespace

void TrainConfig::validate_for(int world_size) const {
  const int model_split = parallelism.tensor_parallel * parallelism.pipeline_parallel;
  if (world_size % model_split != 0)
    fail("the job has ", world_size, " rank(s), which tensor_parallel x pipeline_parallel = ",
         parallelism.tensor_parallel, " x ", parallelism.pipeline_parallel, " = ", model_split,
         " does not divide; launch a multiple of ", model_split, " ranks (--nproc) or change parallelism");
  const int dp_size = world_size / model_split;
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
  for (const auto& ov : overrides) apply_override(root, ov);

  TrainConfig c;
  Section top(root, "config");
  top.get("train_micro_batch_size_per_gpu", c.micro_batch);
  top.get("gradient_accumulation_steps", c.grad_accum);
  top.get("train_batch_size", c.train_batch_size);
  if (c.micro_batch < 1 || c.grad_accum < 1 || (top.has("train_batch_size") && c.train_batch_size < 1))
    fail("train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps must be >= 1 (got ",
         c.train_batch_size, ", ", c.micro_batch, ", ", c.grad_accum, "); leave a key out to derive it from the others");
  // Given train_batch_size, a batch key left out is derived by resolve_for (DeepSpeed's rule).
  if (top.has("train_batch_size")) {
    if (!top.has("train_micro_batch_size_per_gpu")) c.micro_batch = 0;
    if (!top.has("gradient_accumulation_steps")) c.grad_accum = 0;
  }
  top.get("gradient_clipping", c.gradient_clipping);
  top.get("steps", c.steps);
  top.get("seed", c.seed);
  top.get("eval_interval", c.eval_interval);
  top.get("log_interval", c.log_interval);
  top.get("out_dir", c.out_dir);
  top.get("threads", c.threads);
  top.get("init", c.init);
  top.get("checkpoint_interval", c.checkpoint_interval);
  top.get("checkpoint_keep", c.checkpoint_keep);
  if (top.has("device_memory")) {
    const auto& dm = top.raw("device_memory");
    if (!dm.is_number() && !dm.is_string())
      fail("device_memory must be a number of bytes or a size such as \"32GB\" or \"80GiB\", got ", dm.dump());
    c.device_memory = dm.is_number() ? dm.get<double>() : plan::parse_bytes(dm.get<std::string>());
  } else {
    top.raw("device_memory");  // still a valid key when absent
  }
  top.get("resume", c.resume);
  top.get("device", c.device);
  top.get("attn_implementation", c.attn_implementation);

  top.section("optimizer", [&](Section& s) {
    s.get("type", c.optimizer.type);
    if (c.optimizer.type != "AdamW" && c.optimizer.type != "adamw")
      fail("optimizer.type '", c.optimizer.type, "' is not supported; use \"AdamW\"");
    s.section("params", [&](Section& p) {
      p.get("lr", c.optimizer.lr);
      std::vector<double> betas = {c.optimizer.beta1, c.optimizer.beta2};
      p.get("betas", betas);
      if (betas.size() != 2) fail("optimizer.params.betas must be [beta1, beta2]");
      c.optimizer.beta1 = betas[0];
      c.optimizer.beta2 = betas[1];
      p.get("eps", c.optimizer.eps);
      p.get("weight_decay", c.optimizer.weight_decay);
    });
  });
  top.section("scheduler", [&](Section& s) {
    s.get("type", c.scheduler.type);
    if (c.scheduler.type != "constant" && c.scheduler.type != "WarmupCosineLR")
      fail("scheduler.type '", c.scheduler.type, "' is not supported; use \"constant\" or \"WarmupCosineLR\"");
    s.section("params", [&](Section& p) {
      p.get("warmup_num_steps", c.scheduler.warmup_num_steps);
      p.get("warmup_min_ratio", c.scheduler.warmup_min_ratio);
      p.get("cos_min_ratio", c.scheduler.cos_min_ratio);
      p.get("total_num_steps", c.scheduler.total_num_steps);
    });
  });
  top.section("data", [&](Section& s) {
    s.get("train", c.data.train);
    s.get("val", c.data.val);
    s.get("seq_len", c.data.seq_len);
    s.get("format", c.data.format);
    s.get("eval_batches", c.data.eval_batches);
    s.get("tokenizer", c.data.tokenizer);
    s.get("shuffle", c.data.shuffle);
  });
  top.section("comm", [&](Section& s) {
    s.get("timeout_s", c.comm.timeout_s);
    s.get("backend", c.comm.backend);
  });
  top.section("ddp", [&](Section& s) { s.get("bucket_cap_mb", c.ddp.bucket_cap_mb); });
  top.section("debug", [&](Section& s) {
    s.get("consistency_interval", c.debug.consistency_interval);
    s.get("check_collectives", c.debug.check_collectives);
    if (c.debug.consistency_interval < 0)
      fail("debug.consistency_interval must be >= 0 (0: off, k: check every k steps), got ", c.debug.consistency_interval);
  });
  top.section("zero_optimization", [&](Section& s) {
    s.get("stage", c.zero.stage);
    s.get("reduce_bucket_size", c.zero.reduce_bucket_size);
    s.get("allgather_bucket_size", c.zero.allgather_bucket_size);
    s.get("overlap_comm", c.zero.overlap_comm);
    s.get("stage3_prefetch_bucket_size", c.zero.stage3_prefetch_bucket_size);
    s.get("stage3_param_persistence_threshold", c.zero.stage3_param_persistence_threshold);
    s.get("contiguous_gradients", c.zero.contiguous_gradients);
    read_deepspeed_zero_keys(s, c.zero);
  });
  top.section("bf16", [&](Section& s) {
    s.get("enabled", c.bf16);
    s.get("cpu_products", c.bf16_cpu_products);
  });
  top.section("fp16", [&](Section& s) {
    s.get("enabled", c.fp16.enabled);
    s.get("loss_scale", c.fp16.loss_scale);
    s.get("initial_scale_power", c.fp16.initial_scale_power);
    s.get("loss_scale_window", c.fp16.loss_scale_window);
    s.get("hysteresis", c.fp16.hysteresis);
    s.get("min_loss_scale", c.fp16.min_loss_scale);
    s.get("per_unit_loss_scaling", c.fp16.per_unit_loss_scaling);
    s.get("max_loss_scale", c.fp16.max_loss_scale);
    s.only("consecutive_hysteresis", false,
           "the scaler restores its hysteresis only when the scale grows (DeepSpeed's default); resetting it after "
           "every step without overflow (consecutive_hysteresis=true) is not implemented. Set it to false or remove it");
    s.only("auto_cast", false,
           "shardlm runs the whole model in fp16 (inputs included); auto_cast=true is not implemented. Set it to false "
           "or remove it");
  });
  top.section("data_types", [&](Section& s) { s.get("grad_accum_dtype", c.grad_accum_dtype); });
  top.section("activation_checkpointing", [&](Section& s) { s.get("mode", c.activation_checkpointing.mode); });
  top.section("parallelism", [&](Section& s) {
    s.get("tensor_parallel", c.parallelism.tensor_parallel);
    s.get("sequence_parallel", c.parallelism.sequence_parallel);
    s.get("pipeline_parallel", c.parallelism.pipeline_parallel);
    s.get("pipeline_schedule", c.parallelism.pipeline_schedule);
    s.get("pipeline_split", c.parallelism.pipeline_split);
  });

  // Model: a preset plus HF config.json fields; with `init`, the init directory's config.json.
  json model_fields = json::object();
  if (top.has("model")) {
    model_fields = top.raw("model");
    if (!model_fields.is_object()) fail("model must be a JSON object, e.g. {\"preset\": \"demo\"}");
  } else {
    top.raw("model");  // still a valid key when absent
  }
  top.finish();
  if (!c.init.empty()) {
    c.model = model::read_hf_config(c.init + "/config.json");
    c.model_preset = "init:" + c.init;
    // Explicit model fields next to `init` must agree with the checkpoint's config.json.
    json fields = model_fields;
    fields.erase("preset");
    model::LlamaConfig check = c.model;
    model::apply_hf_fields(check, fields, "model");
    if (model::to_hf_json(check) != model::to_hf_json(c.model))
      fail("model fields ", fields.dump(), " contradict ", c.init, "/config.json; with `init` the model shape comes "
           "from that file, so remove them from the model section");
  } else {
    c.model_preset = model_fields.value("preset", std::string("demo"));
    if (model_fields.contains("preset") && !model_fields["preset"].is_string())
      fail("model.preset must be a string, one of the presets");
    c.model = model::preset(c.model_preset);
    json fields = model_fields;
    fields.erase("preset");
    model::apply_hf_fields(c.model, fields, "model");
    c.model.validate();
  }

  if (c.steps < 1) fail("steps must be >= 1, got ", c.steps);
  if (c.data.train.empty()) fail("data.train is not set: give the training token file (e.g. data/brown/train.bin)");
  if (c.data.seq_len < 1) fail("data.seq_len must be >= 1");
  if (c.data.seq_len > c.model.max_position_embeddings && !model::rope_extends_beyond_max_positions(c.model))
    fail("data.seq_len ", c.data.seq_len, " exceeds the model's max_position_embeddings ",
         c.model.max_position_embeddings);
  data::parse_token_format(c.data.format);  // refuses an unknown data.format, listing the known ones
  if (c.comm.timeout_s <= 0) fail("comm.timeout_s must be positive");
  if (c.device != "cpu" && c.device != "cuda") fail("device must be \"cpu\" or \"cuda\", got \"", c.device, "\"");
  if (c.comm.backend != "auto" && c.comm.backend != "mpi" && c.comm.backend != "nccl")
    fail("comm.backend must be \"auto\", \"mpi\" or \"nccl\", got \"", c.comm.backend, "\"");
  if (c.comm.backend == "nccl" && c.device != "cuda")
    fail("comm.backend=nccl needs device=cuda (NCCL moves GPU memory); use comm.backend=mpi on CPU");
  model::parse_attention(c.attn_implementation);  // refuses anything but auto | sdpa | eager
  model::parse_recompute(c.activation_checkpointing.mode);  // none | full | selective
  if (c.ddp.bucket_cap_mb <= 0) fail("ddp.bucket_cap_mb must be positive");
  if (c.optimizer.lr < 0 || c.optimizer.eps <= 0) fail("optimizer.params: lr must be >= 0 and eps > 0");
  if (c.zero.stage < 0 || c.zero.stage > 3) fail("zero_optimization.stage must be 0, 1, 2 or 3, got ", c.zero.stage);
  if (c.bf16 && c.fp16.enabled) fail("bf16.enabled and fp16.enabled are both true; choose one");
  if (c.fp16.enabled && (c.fp16.loss_scale < 0 || c.fp16.loss_scale_window < 1 || c.fp16.hysteresis < 1 ||
                         c.fp16.min_loss_scale <= 0))
    fail("fp16: loss_scale must be >= 0 (0 = dynamic), loss_scale_window >= 1, hysteresis >= 1, min_loss_scale > 0");
  model::parse_bf16_products(c.bf16_cpu_products);  // refuses anything but auto | native | fp32
  if (c.grad_accum_dtype != "fp32" && c.grad_accum_dtype != "bf16")
    fail("data_types.grad_accum_dtype must be \"fp32\" or \"bf16\", got \"", c.grad_accum_dtype, "\"");
  parallel::pp::parse_schedule(c.parallelism.pipeline_schedule);  // gpipe | 1f1b
  parallel::pp::layer_counts(c.model, c.parallelism.pipeline_parallel, c.parallelism.pipeline_split);
  parallel::tp::check_tensor_parallel(c.model, c.parallelism.tensor_parallel, c.parallelism.sequence_parallel, c.data.seq_len);
  if (c.checkpoint_interval < 0) fail("checkpoint_interval must be >= 0 (0: only at the end)");
  if (c.checkpoint_keep < 1) fail("checkpoint_keep must be >= 1 (the newest checkpoints kept), got ", c.checkpoint_keep);
  if (c.eval_interval < 0 || c.log_interval < 1) fail("eval_interval must be >= 0 and log_interval >= 1");
  check_ranges(c);
  return c;
}

std::string config_to_json(const TrainConfig& c) {
  json j = {
      {"train_micro_batch_size_per_gpu", c.micro_batch},
      {"gradient_accumulation_steps", c.grad_accum},
      {"gradient_clipping", c.gradient_clipping},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", c.optimizer.lr},
          {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
          {"eps", c.optimizer.eps},
          {"weight_decay", c.optimizer.weight_decay}}}}},
      {"scheduler",
       {{"type", c.scheduler.type},
        {"params",
         {{"warmup_num_steps", c.scheduler.warmup_num_steps},
          {"warmup_min_ratio", c.scheduler.warmup_min_ratio},
          {"cos_min_ratio", c.scheduler.cos_min_ratio},
          {"total_num_steps", c.scheduler.total_num_steps}}}}},
      {"model", model_fields_json(c.model)},
      {"data",
       {{"train", c.data.train},
        {"val", c.data.val},
        {"seq_len", c.data.seq_len},
        {"format", c.data.format},
        {"eval_batches", c.data.eval_batches},
        {"tokenizer", c.data.tokenizer},
        {"shuffle", c.data.shuffle}}},
      {"steps", c.steps},
      {"seed", c.seed},
      {"eval_interval", c.eval_interval},
      {"log_interval", c.log_interval},
      {"out_dir", c.out_dir},
      {"threads", c.threads},
      {"checkpoint_interval", c.checkpoint_interval},
      {"checkpoint_keep", c.checkpoint_keep},
      {"device_memory", c.device_memory},
      {"resume", c.resume},
      {"device", c.device},
      {"attn_implementation", c.attn_implementation},
      {"comm", {{"timeout_s", c.comm.timeout_s}, {"backend", c.comm.backend}}},
      {"ddp", {{"bucket_cap_mb", c.ddp.bucket_cap_mb}}},
      {"zero_optimization",
       {{"stage", c.zero.stage},
        {"reduce_bucket_size", c.zero.reduce_bucket_size},
        {"allgather_bucket_size", c.zero.allgather_bucket_size},
        {"overlap_comm", c.zero.overlap_comm},
        {"stage3_prefetch_bucket_size", c.zero.stage3_prefetch_bucket_size},
        {"stage3_param_persistence_threshold", c.zero.stage3_param_persistence_threshold},
        {"contiguous_gradients", c.zero.contiguous_gradients}}},
      {"bf16", {{"enabled", c.bf16}, {"cpu_products", c.bf16_cpu_products}}},
      {"fp16",
       {{"enabled", c.fp16.enabled},
        {"loss_scale", c.fp16.loss_scale},
        {"initial_scale_power", c.fp16.initial_scale_power},
        {"loss_scale_window", c.fp16.loss_scale_window},
        {"hysteresis", c.fp16.hysteresis},
        {"min_loss_scale", c.fp16.min_loss_scale},
        {"per_unit_loss_scaling", c.fp16.per_unit_loss_scaling},
        {"max_loss_scale", c.fp16.max_loss_scale}}},
      {"data_types", {{"grad_accum_dtype", c.grad_accum_dtype}}},
      {"activation_checkpointing", {{"mode", c.activation_checkpointing.mode}}},
      {"parallelism",
       {{"tensor_parallel", c.parallelism.tensor_parallel},
        {"sequence_parallel", c.parallelism.sequence_parallel},
        {"pipeline_parallel", c.parallelism.pipeline_parallel},
        {"pipeline_schedule", c.parallelism.pipeline_schedule},
        {"pipeline_split", c.parallelism.pipeline_split}}},
  };
  if (c.train_batch_size) j["train_batch_size"] = c.train_batch_size;
  if (!c.init.empty()) j["init"] = c.init;
  return j.dump(2);
}

precision::Policy precision_of(const TrainConfig& cfg) {
  return precision::policy_for(cfg.bf16, cfg.fp16.enabled, cfg.float64_for_tests);
}

model::Attention attention_for(const TrainConfig& cfg) {
  return model::resolve_attention(cfg.attn_implementation, cfg.device == "cuda", precision_of(cfg).compute);
}

}  // namespace shardlm::train
