// Value checks of config values (config_ranges.h); load_train_config runs them after reading.
#include "train/config_ranges.h"

#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "model/rope.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "parallel/tensor/tp_layout.h"
#include "train/config_keys.h"
#include "util/error.h"

namespace shardlm::train {
namespace {
using json = nlohmann::json;

// `"a", "b" or "c"`
std::string choice_list(const ConfigKey& k) {
  std::string out;
  for (size_t i = 0; i < k.choices.size(); ++i)
    out += (i == 0 ? "" : i + 1 == k.choices.size() ? " or " : ", ") + format_config_value(k.choices[i].first);
  return out;
}

// ` ("llmc": llm.c .bin ...; "raw_u16": ...)` for the choices that say what they mean.
std::string choice_meanings(const ConfigKey& k) {
  std::string out;
  for (const auto& [value, what] : k.choices)
    if (!what.empty()) out += (out.empty() ? "" : "; ") + format_config_value(value) + ": " + what;
  return out.empty() ? "" : " (" + out + ")";
}

bool in_range(const Range& r, const json& v) {
  if (v.is_array()) {
    for (const auto& e : v)
      if (!in_range(r, e)) return false;
    return true;
  }
  return !v.is_number() || r.holds(v.get<double>());
}

}  // namespace

void check_key_values(const TrainConfig& c, const std::set<std::string>& given) {
  for (const auto& k : config_keys()) {
    if (!k.get || k.deepspeed == DeepSpeed::Alias) continue;  // read elsewhere, or checked under its key's name
    if (k.optional && !given.count(k.path)) continue;
    if (k.applies && !k.applies(c)) continue;
    const json v = k.get(c);
    if (k.required && (v.is_null() || v == "")) fail(k.path, " is not set: ", k.fix);
    if (!k.choices.empty()) {
      bool ok = false;
      for (const auto& choice : k.choices) ok = ok || v == choice.first;
      if (!ok) fail(k.path, " must be ", choice_list(k), ", got ", format_config_value(v), choice_meanings(k));
    }
    if (!k.range.empty() && !in_range(k.range, v))
      fail(k.path, " ", k.range.predicate(), k.hint.empty() ? "" : " (" + k.hint + ")", ", got ",
           format_config_value(v), k.fix.empty() ? "" : "; " + k.fix);
  }
}

namespace {

// DeepSpeed passes optimizer.params and scheduler.params to the constructor of the type as keyword
// arguments: a param the type does not take fails there (TypeError). The params each type takes.
void check_params_fit_the_type(const TrainConfig& c, const std::set<std::string>& given) {
  const auto& o = c.optimizer;
  const auto refuse = [&](const std::string& param, const std::string& type, const std::string& why) {
    if (given.count(param)) fail(param, " is not a parameter of optimizer.type \"", type, "\" (", why, "); remove it");
  };
  if (o.type != "Lamb")
    for (const char* p : {"optimizer.params.max_coeff", "optimizer.params.min_coeff", "optimizer.params.eps_inside_sqrt"})
      refuse(p, o.type, "a Lamb parameter");
  if (o.type == "Lamb")
    for (const char* p : {"optimizer.params.adam_w_mode", "optimizer.params.torch_adam"})
      refuse(p, o.type, "an Adam parameter; DeepSpeed's FusedLamb takes no such argument");
  if (o.type != "Lamb" && o.torch_adam && given.count("optimizer.params.bias_correction"))
    fail("optimizer.params.bias_correction is not a parameter of torch.optim.Adam(W), which torch_adam = true "
         "selects; remove it or torch_adam");
  const std::string prefix = "scheduler.params.";
  for (const auto& param : given) {
    // shardlm's "constant" takes none: a param given with it is named in a notice (config_deepspeed.cpp).
    if (param.rfind(prefix, 0) != 0 || c.scheduler.type == "constant") continue;
    if (!scheduler_takes(c.scheduler.type, param.substr(prefix.size())))
      fail(param, " is not a parameter of scheduler.type \"", c.scheduler.type, "\"; remove it or choose the scheduler ",
           "that takes it");
  }
}

// DeepSpeed's bf16 masters (bf16.bf16_master_weights_and_grads, bf16_optimizer_states), which
// resolve_deepspeed_values reads onto shardlm's keys: refused where DeepSpeed 0.19.8 refuses them
// (runtime/config.py _do_error_check, base_optimizer.py _configure_master_weights and the ZeRO
// optimizers' bf16_offload_validator: ZeRO stages 1-3, its CPU Adam only) or shardlm has no
// equivalent. What is left meets the rules of shardlm's bf16 masters in check_relations (a CUDA run
// needs offload_optimizer), whose errors load_train_config names by this key.
void check_deepspeed_bf16_masters(const TrainConfig& c, const std::set<std::string>& given) {
  const std::string key = "bf16.bf16_master_weights_and_grads";
  if (c.bf16_optimizer_states && !c.bf16_master_weights_and_grads)
    fail("bf16.bf16_optimizer_states = true needs ", key, " = true (DeepSpeed refuses it alone: "
         "\"bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled\"); set ", key, " to true "
         "for bf16 masters with bf16 moments, or bf16_optimizer_states to false (bf16 moments over fp32 masters, "
         "which DeepSpeed lacks, are optimizer.state_precision \"bf16\")");
  if (!c.bf16_master_weights_and_grads) return;
  const auto& o = c.optimizer;
  const std::string is = key + " = true";
  if (!c.bf16)
    fail(is, " needs bf16.enabled = true: shardlm's bf16 masters are the bf16 working shard, so ",
         c.fp16.enabled ? "fp16" : "fp32", " compute has none (DeepSpeed would round the weights to separate bf16 "
         "masters, which shardlm does not build); set bf16.enabled to true, or ", key, " to false");
  if (c.zero.stage == 0)
    fail(is, " needs ZeRO (DeepSpeed asserts zero_optimization.stage 1, 2 or 3 for it); set "
         "zero_optimization.stage to 1, 2 or 3, or ", key, " to false");
  if (o.type == "Lamb" || o.torch_adam)
    fail(is, " with ", o.type == "Lamb" ? "optimizer.type \"Lamb\"" : "optimizer.params.torch_adam = true",
         ": DeepSpeed steps bf16 masters only with its CPU Adam (the ZeRO optimizers' bf16_offload_validator "
         "asserts DeepSpeedCPUAdam), and shardlm's bf16 masters are Adam and AdamW; set ",
         o.type == "Lamb" ? "optimizer.type to \"AdamW\"" : "optimizer.params.torch_adam to false", ", or ", key,
         " to false");
  // The shardlm keys the config gives itself must be what the key reads as.
  const std::string states = c.bf16_optimizer_states || !o.fp32_optimizer_states ? "bf16" : "fp32";
  const std::string why_states = c.bf16_optimizer_states ? "bf16.bf16_optimizer_states = true"
                                 : !o.fp32_optimizer_states ? "optimizer.params.fp32_optimizer_states = false"
                                                            : "bf16.bf16_optimizer_states = false";
  for (const auto& [shardlm_key, value, mapped, because] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"optimizer.master_precision", o.master_precision, "bf16", is},
           {"optimizer.master_rounding", o.master_rounding, "nearest",
            is + " (DeepSpeed's CPU Adam rounds each update to nearest once; it has no Kahan or stochastic rounding)"},
           {"optimizer.state_precision", o.state_precision, states, is + " with " + why_states}})
    if (given.count(shardlm_key) && value != mapped)
      fail(shardlm_key, " = \"", value, "\" contradicts ", because, ", which means ", shardlm_key, " \"", mapped,
           "\"; remove ", shardlm_key, " (or give the shardlm keys alone, without ", key, ")");
  // Gradients: DeepSpeed rounds them to bf16 before clipping and the step. shardlm's step sees the
  // compute dtype (bf16) at stage 1 and data_types.grad_accum_dtype at stages 2-3.
  const bool fp32_grads = given.count("data_types.grad_accum_dtype") && c.grad_accum_dtype == "fp32";
  if (fp32_grads && c.zero.stage == 1 && c.zero.offload_optimizer.device == "none")
    fail(is, " with zero_optimization.stage 1, data_types.grad_accum_dtype \"fp32\" and no optimizer offload is "
         "the case DeepSpeed 0.19.8 hands to its BF16_Optimizer, which ignores the key and keeps fp32 masters "
         "(engine.py _do_optimizer_sanity_check); shardlm will not guess which was meant: set "
         "zero_optimization.offload_optimizer.device to \"cpu\" (DeepSpeed's bf16 masters, through its CPU Adam), or ",
         key, " to false (what DeepSpeed runs here: fp32 masters)");
  if (fp32_grads && c.zero.stage >= 2)
    fail(is, " with data_types.grad_accum_dtype \"fp32\" at zero_optimization.stage ", c.zero.stage,
         ": DeepSpeed rounds the gradient to bf16 before clipping and the step, and shardlm's stage ", c.zero.stage,
         " would step on the fp32 gradient shard; remove data_types.grad_accum_dtype (the key then reads as "
         "\"bf16\", DeepSpeed's default under bf16) or set it to \"bf16\"");
}

}  // namespace

bool scheduler_takes(const std::string& type, const std::string& param) {
  static const std::map<std::string, std::set<std::string>> takes = {
      {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}},
      {"WarmupDecayLR",
       {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}},
      {"WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}}};
  const auto it = takes.find(type);
  return it != takes.end() && it->second.count(param) != 0;
}

namespace {

// The rules between the lora section (train/lora_config.h) and the rest of the config: lora keys
// without lora.enabled, lora.config beside the keys it replaces, and the layouts LoRA is not built
// for yet (expert and context parallelism), each refused naming the key.
void check_lora_relations(const TrainConfig& c, const std::set<std::string>& given) {
  std::vector<std::string> keys;
  for (const auto& g : given)
    if (g.rfind("lora.", 0) == 0 && g != "lora.enabled") keys.push_back(g);
  if (!c.lora.enabled) {
    if (!keys.empty()) fail(keys[0], " is set but lora.enabled is false; set lora.enabled to true to train LoRA adapters, or remove it");
    return;
  }
  if (!c.lora.config.empty())
    for (const auto& k : keys)
      if (k != "lora.config" && k != "lora.init_from" && k != "lora.enabled")
        fail(k, " beside lora.config: the adapter_config.json gives every LoRA key; remove ", k, " or lora.config");
  const auto refuse = [](const std::string& key, const std::string& value, const std::string& why) {
    fail("lora.enabled with ", key, " ", value, " is not built yet (", why, "; LoRA runs on one process, DDP, ZeRO "
         "stages 1-3, tensor and sequence parallelism, pipeline parallelism and context parallelism); set ", key,
         " to 1");
  };
  if (c.parallelism.expert_parallel > 1)
    refuse("parallelism.expert_parallel", std::to_string(c.parallelism.expert_parallel),
           "no run checks the adapters against one process with the experts split over ranks, and "
           "lora.target_parameters' per-expert adapters would have to follow their experts");
}

}  // namespace

// QLoRA's 4-bit base (the quantization section, model/quant/quantized_base.h) and the layouts and
// dtypes that can hold it.
void check_quantization(const TrainConfig& c) {
  const auto& q = c.quantization;
  if (q.load_in_8bit)
    fail("quantization.load_in_8bit = true (or _load_in_8bit): 8-bit (LLM.int8) frozen bases are not built; QLoRA's ",
         "4-bit base is quantization.load_in_4bit = true. Set load_in_8bit to false or remove it");
  if (!q.llm_int8_skip_modules.empty())
    fail("quantization.llm_int8_skip_modules = [\"", q.llm_int8_skip_modules.front(), "\", ...]: keeping modules out of ",
         "4-bit is not built (the decoder's linears are all 4-bit, the embedding, norms and head never); remove it ",
         "or set it to null");
  if (!q.load_in_4bit) return;
  if (!c.lora.enabled)
    fail("quantization.load_in_4bit without lora.enabled: a 4-bit base is frozen, so only adapters can train on it ",
         "(QLoRA); set lora.enabled to true (docs/lora.md), or remove quantization.load_in_4bit to train every weight");
  const std::string run = c.bf16 ? "bfloat16" : c.fp16.enabled ? "float16" : "float32";
  if (q.bnb_4bit_compute_dtype != "auto" && q.bnb_4bit_compute_dtype != run)
    fail("quantization.bnb_4bit_compute_dtype = \"", q.bnb_4bit_compute_dtype, "\" differs from the run's compute dtype ",
         run, " (", c.bf16 ? "bf16.enabled" : c.fp16.enabled ? "fp16.enabled" : "neither bf16 nor fp16 enabled",
         "); set it to \"", run, "\" or \"auto\", or change the run's dtype");
  if (c.parallelism.tensor_parallel > 1)
    fail("quantization.load_in_4bit with parallelism.tensor_parallel ", c.parallelism.tensor_parallel,
         " is not built: bitsandbytes' blocks of 64 run over the whole weight, which tensor parallelism splits; ",
         "set parallelism.tensor_parallel to 1 (data parallelism, ZeRO and pipeline stages can hold a 4-bit base)");
  if (c.model.is_moe())
    fail("quantization.load_in_4bit with a mixture-of-experts model is not built (the experts' 3-D weights are ",
         "not linears bitsandbytes quantizes); remove the quantization section or use a dense model");
}

void check_relations(const TrainConfig& c, const std::set<std::string>& given) {
  check_params_fit_the_type(c, given);
  check_quantization(c);
  check_deepspeed_bf16_masters(c, given);
  check_lora_relations(c, given);
  // Lamb's trust ratio is a norm over each whole parameter; ZeRO and tensor parallelism hand the
  // optimizer pieces of parameters. DeepSpeed itself refuses Lamb under ZeRO unless told to run it
  // on the flat partitions (zero_allow_untested_optimizer), which changes what the ratio measures.
  if (c.optimizer.type == "Lamb" && c.zero.stage > 0)
    fail("optimizer.type \"Lamb\" with zero_optimization.stage ", c.zero.stage, ": Lamb's trust ratio needs each ",
         "parameter whole, and ZeRO shards them across ranks (DeepSpeed, too, runs Lamb under ZeRO only on flat ",
         "partitions, which changes the ratio); use zero_optimization.stage 0 or optimizer.type \"AdamW\"");
  if (c.optimizer.type == "Lamb" && c.parallelism.tensor_parallel > 1)
    fail("optimizer.type \"Lamb\" with parallelism.tensor_parallel ", c.parallelism.tensor_parallel,
         ": Lamb's trust ratio needs each parameter whole, and tensor parallelism splits them; use "
         "parallelism.tensor_parallel 1 or optimizer.type \"AdamW\"");
  // Compact optimizer states (optim/quantized_state.h) exist for the Adam rules; 8-bit blocks are
  // per tensor-parallel piece, which a checkpoint cannot re-split onto another TP size yet.
  if (c.optimizer.state_precision != "fp32" && c.optimizer.type == "Lamb")
    fail("optimizer.state_precision \"", c.optimizer.state_precision, "\" with optimizer.type \"Lamb\" is not built ",
         "(compact moments exist for Adam and AdamW); use optimizer.state_precision \"fp32\" or optimizer.type \"AdamW\"");
  if (c.optimizer.state_precision == "8bit" && c.parallelism.tensor_parallel > 1)
    fail("optimizer.state_precision \"8bit\" with parallelism.tensor_parallel ", c.parallelism.tensor_parallel,
         " is not built (quantization blocks would follow the tensor-parallel pieces); use "
         "optimizer.state_precision \"bf16\" or parallelism.tensor_parallel 1");
  // bf16 master weights (optim/master_format.h): the bf16 working shard is the master, so they need
  // bf16 compute; Lamb steps whole tensors. Optimizer offload keeps the bf16 master (and Kahan's
  // compensation) in host memory or the NVMe files; the update is host code, so a GPU runs it there.
  // Parameter offload pages the bf16 shards, which are the masters (as fp32 compute's): on a CPU run in
  // place, on a CUDA run as the host optimizer's masters (the host parameter shards are those masters).
  if (given.count("optimizer.master_rounding") && c.optimizer.master_precision != "bf16")
    fail("optimizer.master_rounding applies to optimizer.master_precision \"bf16\" only; remove it or set "
         "optimizer.master_precision to \"bf16\"");
  if (c.optimizer.master_precision == "bf16") {
    if (!c.bf16)
      fail("optimizer.master_precision \"bf16\" needs bf16 compute (the bf16 working shard is the master): set ",
           "bf16.enabled to true", c.fp16.enabled ? " instead of fp16.enabled (fp16 masters are not built)" : "",
           ", or optimizer.master_precision to \"fp32\"");
    if (c.optimizer.type == "Lamb")
      fail("optimizer.master_precision \"bf16\" with optimizer.type \"Lamb\" is not built (bf16 masters exist for ",
           "Adam and AdamW); use optimizer.master_precision \"fp32\" or optimizer.type \"AdamW\"");
    if (c.zero.offload_param.device != "none" && c.device == "cuda" && c.zero.offload_optimizer.device == "nvme")
      fail("optimizer.master_precision \"bf16\" with zero_optimization.offload_param.device \"",
           c.zero.offload_param.device, "\" and offload_optimizer.device \"nvme\" on a CUDA run is not built (the ",
           "state files would page a second copy of the bf16 masters, which are the host parameter shards); set ",
           "offload_optimizer.device to \"cpu\", offload_param.device to \"none\", or optimizer.master_precision to ",
           "\"fp32\"");
    if (c.device == "cuda" && c.zero.offload_optimizer.device == "none")
      fail("optimizer.master_precision \"bf16\" on a CUDA run needs zero_optimization.offload_optimizer.device ",
           "\"cpu\" (or \"nvme\"): its update is host code, which runs on the host optimizer's bf16 masters; set ",
           "offload_optimizer.device to \"cpu\" (with zero_optimization.stage 1, 2 or 3), or ",
           "optimizer.master_precision to \"fp32\"");
  }
  // Offload: optimizer states to the host on a GPU run is ZeRO-Offload (parallel/zero/host_optimizer.h),
  // to NVMe ZeRO-Infinity's (state_offload.h, through the host); parameters to the host or NVMe
  // ZeRO-Infinity's (zero_engine.h offload_param_apart); NVMe optimizer offload needs ZeRO and a directory.
  if (c.zero.offload_optimizer.device == "cpu" && c.device == "cuda" && c.zero.stage == 0)
    fail("zero_optimization.offload_optimizer.device = \"cpu\" on a CUDA run needs ZeRO (as in DeepSpeed): set "
         "zero_optimization.stage to 1, 2 or 3");
  if (c.zero.offload_optimizer.device == "nvme") {  // parallel/zero/state_offload.h
    if (c.zero.stage == 0)
      fail("zero_optimization.offload_optimizer.device = \"nvme\" needs ZeRO (as in DeepSpeed): set "
           "zero_optimization.stage to 1, 2 or 3");
    if (c.zero.offload_optimizer.nvme_path.empty())
      fail("zero_optimization.offload_optimizer.device = \"nvme\" needs zero_optimization.offload_optimizer.nvme_path: "
           "set it to a directory on a local disk for the state files");
    if (c.zero.offload_optimizer.buffer_count < 2)
      fail("zero_optimization.offload_optimizer.buffer_count = ", c.zero.offload_optimizer.buffer_count,
           ": NVMe offload streams the states through at least 2 buffers; set it to 2 or more (DeepSpeed's default 4)");
  }
  // Parameter offload (parallel/zero/param_offload.h): stage 3 only, as in DeepSpeed.
  if (c.zero.offload_param.device != "none" && c.zero.stage != 3)
    fail("zero_optimization.offload_param.device = \"", c.zero.offload_param.device, "\" needs ZeRO stage 3 (as in ",
         "DeepSpeed: only stage 3 partitions the parameters); set zero_optimization.stage to 3, or ",
         "zero_optimization.offload_param.device to \"none\"");
  if (c.zero.offload_param.device == "nvme") {
    if (c.zero.offload_param.nvme_path.empty())
      fail("zero_optimization.offload_param.device = \"nvme\" needs zero_optimization.offload_param.nvme_path: set it ",
           "to a directory on a local disk for the parameter files");
    if (c.zero.offload_param.buffer_count < 2)
      fail("zero_optimization.offload_param.buffer_count = ", c.zero.offload_param.buffer_count, ": the optimizer step ",
           "streams the parameter shards through at least 2 buffers; set it to 2 or more (DeepSpeed's default 5)");
  }
  if (c.data.seq_len > c.model.max_position_embeddings && !model::rope_extends_beyond_max_positions(c.model))
    fail("data.seq_len ", c.data.seq_len, " exceeds the model's max_position_embeddings ",
         c.model.max_position_embeddings);
  if (c.comm.backend == "nccl" && c.device != "cuda")
    fail("comm.backend=nccl needs device=cuda (NCCL moves GPU memory); use comm.backend=mpi on CPU");
  if (c.bf16 && c.fp16.enabled) fail("bf16.enabled and fp16.enabled are both true; choose one");
  if (c.zero.mics_shard_size > 0 && c.zero.stage != 3)
    fail("zero_optimization.mics_shard_size = ", c.zero.mics_shard_size, " needs ZeRO stage 3, as in DeepSpeed (MiCS ",
         "shards ZeRO-3's parameters); set zero_optimization.stage to 3, or for stages 1-2 use ",
         "parallelism.hybrid_shard = true with parallelism.shard_group_size");
  if (c.zero.mics_shard_size > 0 && c.parallelism.hybrid_shard && c.parallelism.shard_group_size != 0 &&
      c.parallelism.shard_group_size != c.zero.mics_shard_size)
    fail("zero_optimization.mics_shard_size = ", c.zero.mics_shard_size, " and parallelism.shard_group_size = ",
         c.parallelism.shard_group_size, " disagree; give the group size once");
  if ((c.parallelism.hybrid_shard || c.zero.mics_shard_size > 0) && c.zero.stage == 0)
    fail("parallelism.hybrid_shard needs ZeRO stage 1, 2 or 3 (stage 0 shards nothing: plain data parallelism ",
         "already replicates everything); set zero_optimization.stage");
  if (!c.parallelism.hybrid_shard && c.parallelism.shard_group_size != 0)
    fail("parallelism.shard_group_size = ", c.parallelism.shard_group_size, " is set without parallelism.hybrid_shard; ",
         "set parallelism.hybrid_shard = true to shard within groups of that size, or remove it");
  if (!c.data.blend.empty() && !c.data.train.empty())
    fail("data.train and data.blend are both set; data.blend lists every training dataset with its weight, so set ",
         "data.train to \"\" (or leave data.blend out to train on data.train alone)");
  parallel::pp::layer_counts(c.model, c.parallelism.pipeline_parallel, c.parallelism.pipeline_split);
  parallel::pp::check_schedule(parallel::pp::parse_schedule(c.parallelism.pipeline_schedule),
                               c.parallelism.pipeline_parallel, c.parallelism.virtual_pipeline_parallel, c.grad_accum,
                               c.model.num_hidden_layers);
  if (c.parallelism.virtual_pipeline_parallel > 1 && !c.parallelism.pipeline_split.empty())
    fail("parallelism.pipeline_split is not supported with virtual_pipeline_parallel > 1 (the layers split evenly over "
         "the p x v model chunks); remove pipeline_split");
  parallel::tp::check_tensor_parallel(c.model, c.parallelism.tensor_parallel, c.parallelism.sequence_parallel,
                                      c.data.seq_len);
}

}  // namespace shardlm::train
