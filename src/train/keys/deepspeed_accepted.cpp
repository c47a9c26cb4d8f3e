// DeepSpeed's keys outside shardlm's sections: its runtime switches, timers and printouts, older names,
// torch.compile and DeepCompile, the FLOPs profiler, the collective logger, aio tuning, the monitors
// (TensorBoard, W&B, CSV, Comet) and its engine sections; accepted with a notice when they change
// nothing shardlm computes, refused when they would change the arithmetic.
#include "train/keys/sections.h"

#include "train/keys/rows.h"
#include "util/error.h"

namespace shardlm::train::keys {
namespace {

const char* const kAio = "tuning of DeepSpeed's aio library; shardlm's NVMe store has its own (O_DIRECT on 2 threads)";

const char* const kDeepCompileMemory = "a DeepCompile memory option; shardlm does not compile the model";

// The notice of a monitor shardlm does not write, pointing at the files it does write.
std::string not_written(const std::string& monitor, const std::string& then) {
  return monitor + " monitor, not written: shardlm writes metrics.jsonl, and with tensorboard.enabled TensorBoard "
         "event files (" + then + ")";
}

}  // namespace

// DeepSpeed's runtime keys that change nothing shardlm computes: older names, its timers and printouts,
// torch.compile, the FLOPs profiler, the collective logger and aio tuning.
std::vector<ConfigKey> deepspeed_runtime() {
  return {
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
  };
}

// DeepSpeed's monitors: TensorBoard and CSV are written (observe/monitors.h); W&B and Comet are not,
// and their notice points at the TensorBoard files.
std::vector<ConfigKey> deepspeed_monitors() {
  return {
    key(D, "tensorboard.enabled", FIELD(tensorboard.enabled),
        "the logging rank writes TensorBoard event files of every metrics.jsonl field (train/loss, "
        "train/learning_rate, ...; docs/monitoring.md) in output_path/job_name"),
    key(D, "tensorboard.output_path", FIELD(tensorboard.output_path),
        "the TensorBoard monitor's directory; empty: the working directory"),
    key(D, "tensorboard.job_name", FIELD(tensorboard.job_name),
        "the TensorBoard monitor's folder inside output_path ('/' nests folders; '..' refused)"),
    noted<bool>("wandb.enabled", not_written("a Weights & Biases", "`wandb sync --sync-tensorboard DIR` uploads them")),
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
    noted<bool>("comet.enabled", not_written("a Comet", "TensorBoard shows them while the run trains")),
    noted<int64_t>("comet.samples_log_interval", "the Comet monitor's interval"),
    noted<std::string>("comet.project", "the Comet monitor's project"),
    noted<std::string>("comet.workspace", "the Comet monitor's workspace"),
    noted<std::string>("comet.api_key", "the Comet monitor's key"),
    noted<std::string>("comet.experiment_name", "the Comet monitor's run name"),
    noted<std::string>("comet.experiment_key", "the Comet monitor's run key"),
    noted<bool>("comet.online", "the Comet monitor's mode"),
    noted<std::string>("comet.mode", "the Comet monitor's mode"),
  };
}

// DeepSpeed's DeepCompile options (compile.*); shardlm does not compile the model.
std::vector<ConfigKey> deepspeed_compile() {
  return {
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
  };
}

// DeepSpeed's engine sections and top-level switches: accepted when they change nothing, refused when
// they would change the arithmetic.
std::vector<ConfigKey> deepspeed_engine() {
  return {
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
    custom(D, "sequence_parallel_size", "integer",
           "DeepSpeed-Ulysses: parallelism.context_parallel with context_parallel_mode \"all_to_all\"",
           [](const json& v) { return json_type_problem<int>(v); },
           [](TrainConfig& c, const json& v) {
             const int n = v.get<int>();
             if (n < 1) fail("sequence_parallel_size must be >= 1, got ", n);
             if (n == 1) return;
             c.parallelism.context_parallel = n;
             c.parallelism.context_parallel_mode = "all_to_all";
           },
           [](const TrainConfig& c) {
             return json(c.parallelism.context_parallel_mode == "all_to_all" ? c.parallelism.context_parallel : 1);
           })
        .optional("1").written_if([](const TrainConfig&) { return false; }),
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
  };
}

}  // namespace shardlm::train::keys
