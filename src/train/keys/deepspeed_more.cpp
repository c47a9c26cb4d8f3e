// More of DeepSpeed's keys: its bf16 masters and data_types keys (read onto shardlm's keys by
// resolve_deepspeed_values, config_deepspeed.cpp), AutoTP's section beyond autotp_size, ZeRO-3
// internals, and the schedules and features shardlm lacks (LRRangeTest, OneCycle, elasticity, MoQ,
// sparse attention, curriculum learning, ...), refused unless switched off.
#include "train/keys/sections.h"

#include "train/keys/rows.h"
#include "util/error.h"

namespace shardlm::train::keys {
namespace {

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

const char* const kNoOneCycle =
    "DeepSpeed's OneCycle schedule is not implemented in shardlm (its schedules: constant, WarmupLR, WarmupDecayLR, "
    "WarmupCosineLR); remove OneCycle's params and choose one of those with scheduler.type";
const char* const kNoLrRangeTest =
    "DeepSpeed's LRRangeTest schedule is not implemented in shardlm (its schedules: constant, WarmupLR, "
    "WarmupDecayLR, WarmupCosineLR); remove LRRangeTest's params and choose one of those with scheduler.type";

}  // namespace

// DeepSpeed's bf16 masters and the data_types keys, read onto shardlm's keys by resolve_deepspeed_values
// (config_deepspeed.cpp) and refused where DeepSpeed refuses them or shardlm has no equivalent
// (config_ranges.cpp).
std::vector<ConfigKey> deepspeed_masters() {
  return {
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
  };
}

// DeepSpeed's AutoTP section (tensor_parallel.*) beyond autotp_size: accepted when the arithmetic is the
// same, refused when it is DeepSpeed's inference setting.
std::vector<ConfigKey> deepspeed_tensor_parallel() {
  return {
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
  };
}

// zero_optimization keys of DeepSpeed's ZeRO-3 implementation that change nothing shardlm computes, or
// that it refuses.
std::vector<ConfigKey> deepspeed_zero() {
  return {
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
  };
}

// DeepSpeed's schedules and features shardlm lacks (LRRangeTest, OneCycle, elasticity, MoQ, sparse
// attention, curriculum learning, ...): refused unless switched off.
std::vector<ConfigKey> deepspeed_removed() {
  return {
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
}

}  // namespace shardlm::train::keys
