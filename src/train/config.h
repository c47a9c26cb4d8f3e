// The training configuration: one struct per section, read from a DeepSpeed-style JSON file plus
// `--section.key=value` overrides, validated once at start-up. Unknown keys are errors that list
// the valid ones (DeepSpeed refuses them only in its pydantic sections; a typo'd top-level
// "gradient_acumulation_steps" that silently trains with the default costs a day of compute).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>


#include "model/attention.h"
#include "model/lora.h"
#include "model/llama_config.h"
#include "observe/monitors.h"
#include "optim/lr_schedule.h"
#include "parallel/zero/zero_defaults.h"
#include "precision/grad_scaler.h"
#include "precision/policy.h"

namespace shardlm::train {

// DeepSpeed's optimizer section. type: "AdamW", "Adam" (adam_w_mode true: AdamW's arithmetic;
// false: L2 weight decay in the gradient, torch.optim.Adam) or "Lamb" (FusedLamb's trust ratio),
// as the pinned DeepSpeed's _configure_basic_optimizer builds them (optim/adamw.h). When the config
// names a type, its absent params take that DeepSpeed optimizer's defaults (config.cpp); these
// initializers are shardlm's own values, which an absent optimizer section and "auto" take.
struct OptimizerConfig {
  std::string type = "AdamW";
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool adam_w_mode = true;       // Adam: false = L2 regularization (no effect with AdamW, as in DeepSpeed)
  bool bias_correction = true;   // FusedAdam / FusedLamb: false uses the moments uncorrected
  bool torch_adam = false;       // DeepSpeed: torch.optim.Adam(W) instead of FusedAdam, the same arithmetic
  double max_coeff = 10.0;       // Lamb: the trust ratio's upper clamp
  double min_coeff = 0.01;       // Lamb: its lower clamp
  bool eps_inside_sqrt = false;  // Lamb: sqrt(v + eps) instead of sqrt(v) + eps
  std::string state_precision = "fp32";  // shardlm's own: fp32 | bf16 | 8bit moments (optim/quantized_state.h)
  int64_t min_8bit_size = 4096;          // 8-bit: smaller parameters keep fp32 moments (bitsandbytes')
  std::string master_precision = "fp32";  // shardlm's own: fp32 | bf16 master weights (optim/master_format.h)
  std::string master_rounding = "kahan";  // bf16 masters: kahan | stochastic | nearest
  // DeepSpeed's CPU Adam state dtype (params.fp32_optimizer_states): false keeps the moments of
  // DeepSpeed's bf16 masters (bf16.bf16_master_weights_and_grads) in bf16; no effect otherwise.
  bool fp32_optimizer_states = true;
};

// DeepSpeed's scheduler section: the schedule's own (optim/lr_schedule.h).
using SchedulerConfig = optim::SchedulerConfig;

struct DataConfig {
  std::string train;
  std::string val;               // empty: no validation
  int64_t seq_len = 256;
  std::string format = "llmc";   // "llmc" (llm.c .bin, 16- or 32-bit) | "raw_u16" (nanoGPT) | "raw_u32"
  int64_t eval_batches = 8;      // micro-batches per rank per evaluation
  std::string tokenizer;         // optional SentencePiece model or tokenizer.json, copied into out_dir for `generate`
  bool shuffle = false;          // training windows in a seeded order, new each pass (data/loader/data_loader.h)
  // Several training datasets with weights, Megatron's blending (data/loader/blend.h): (weight, file or
  // glob) pairs in place of `train`; empty: `train` alone.
  std::vector<std::pair<double, std::string>> blend;
  int64_t prefetch = 2;          // batches assembled ahead by a background thread (data/loader/prefetch.h); 0: none
};

struct CommConfig {
  double timeout_s = 300.0;
  std::string backend = "auto";  // "auto" (nccl on cuda, mpi on cpu) | "mpi" | "nccl"
};

// The collective flight recorder (comm/flight_recorder.h): each rank's last operations, written to
// out_dir/flight_recorder when a run hangs or crashes, read by `shardlm diagnose`.
struct FlightRecorderConfig {
  bool enabled = true;
};

struct DdpConfig {
  double bucket_cap_mb = 25.0;
};

// shardlm's debug section: checks that cost time, off by default.
struct DebugConfig {
  // Every k steps compare the replicated gradients (before the update) and parameters (after it)
  // across their replicas and stop on a difference (parallel/consistency.h); 0: never.
  int64_t consistency_interval = 0;
  // Check before every collective that all ranks of the group make the same call
  // (comm/checked_communicator.h); a small all-gather per collective.
  bool check_collectives = false;
};

// DeepSpeed's zero_optimization section. Stage 0 is plain data parallelism (ddp section).
struct ZeroConfig {
  int stage = 0;
  double reduce_bucket_size = parallel::zero_defaults::kReduceBucketSize;  // elements; at most the largest unit per bucket; 0: unit by unit
  double allgather_bucket_size = parallel::zero_defaults::kAllgatherBucketSize;  // elements; the post-step parameter refresh coalesces up to this
  bool overlap_comm = true;
  double stage3_prefetch_bucket_size = parallel::zero_defaults::kStage3PrefetchBucketSize;  // elements prefetched ahead of use
  double stage3_param_persistence_threshold = parallel::zero_defaults::kStage3ParamPersistenceThreshold;  // units smaller than this stay gathered
  bool contiguous_gradients = true;     // always on: gradients are copied into flat buffers
  // Accepted with DeepSpeed's meaning; none changes the arithmetic (README "DeepSpeed configs"):
  double sub_group_size = 1e9;          // elements per optimizer-step tile; NVMe offload chunks (<= 2^16)
  bool round_robin_gradients = false;   // gradient copy order (an offload optimisation); no effect here
  // Not enforced: ZeRO-3's gathered set is governed by stage3_prefetch_bucket_size and
  // stage3_param_persistence_threshold (each unit is released after its use).
  double stage3_max_live_parameters = 1e9;
  double stage3_max_reuse_distance = 1e9;
  bool stage3_gather_16bit_weights_on_model_save = true;  // shardlm always saves the full HF model
  bool ignore_unused_parameters = true; // a Llama has none
  double stage3_model_persistence_threshold = 9.223372036854775807e18;  // sys.maxsize: not enforced
  // Offload (ZeRO-Offload / ZeRO-Infinity): "none", "cpu" on a CPU run (the states already live in
  // host memory), or "nvme": the optimizer states (parallel/zero/state_offload.h: nvme_path,
  // buffer_count; ZeRO stages 1-3 on CPU runs) or the parameters (parallel/zero/param_offload.h; stage
  // 3). "cpu" on CUDA is refused until built (config_ranges.cpp, the key table). The other fields are
  // DeepSpeed's, validated and kept.
  struct OffloadOptimizer {
    std::string device = "none";  // "none" | "cpu" | "nvme"
    std::string nvme_path;
    int64_t buffer_count = 4;
    bool pin_memory = true;
    bool pipeline_read = false, pipeline_write = false, fast_init = false;
    double ratio = 1.0;
    bool super_offload = false;
    double cpuadam_cores_perc = 0.8;
  } offload_optimizer;
  struct OffloadParam {
    std::string device = "none";  // "none" | "cpu" | "nvme"
    std::string nvme_path;
    int64_t buffer_count = 5;
    double buffer_size = 1e8;
    double max_in_cpu = 1e9;
    bool pin_memory = true;
  } offload_param;
  int mics_shard_size = -1;             // DeepSpeed's MiCS: > 0 shards within groups of this many ranks (hybrid)
};

// DeepSpeed's fp16 section: fp16 compute with loss scaling, the grad scaler's own options
// (precision/grad_scaler.h); loss_scale 0 is dynamic.
using Fp16Config = precision::GradScalerOptions;

// Activation checkpointing (model/recompute.h).
struct ActivationCheckpointingConfig {
  std::string mode = "none";  // "none" | "full" | "selective"
};

// LoRA adapters (model/lora.h, train/lora_config.h, docs/lora.md): PEFT LoraConfig's keys and
// meanings, read into the model's options (model::LoraOptions: r, lora_alpha, target_modules, ...).
struct LoraConfig {
  bool enabled = false;
  std::string config;     // PEFT's adapter_config.json, read as the section's keys
  std::string init_from;  // an adapter directory (adapter_model.safetensors) to start from
  std::string bias = "none";
  bool use_dora = false;
  model::LoraOptions peft;
};

// How the model is split (parallel/parallelize.h). The data-parallel size is what is left:
// world / (tensor_parallel x pipeline_parallel).
struct ParallelismConfig {
  int tensor_parallel = 1;         // Megatron column/row split inside each layer
  bool sequence_parallel = false;  // with tensor_parallel > 1: norms and residuals split along the sequence
  int pipeline_parallel = 1;       // stages of consecutive layers (parallel/pipeline/)
  std::string pipeline_schedule = "1f1b";  // "gpipe" | "1f1b" | "interleaved_1f1b" | "zb_h1"
  int virtual_pipeline_parallel = 1;       // model chunks per pipeline rank (interleaved_1f1b)
  std::vector<int64_t> pipeline_split;     // decoder layers per stage; empty: balanced
  // Hybrid sharding (parallel/parallel_dims.h): ZeRO shards within groups of shard_group_size
  // data-parallel ranks and replicates across them; 0: the data-parallel ranks of one node.
  bool hybrid_shard = false;
  int shard_group_size = 0;
  // Expert parallelism (parallel/expert/expert_parallel.h): the experts of every sparse layer split
  // over this many data-parallel ranks (a divisor of the data-parallel size and of the experts).
  int expert_parallel = 1;
  // Context parallelism (parallel/context/context_parallel.h): every sequence split over this many
  // ranks (between tp and dp in the rank order), K/V exchanged by context_parallel_mode.
  int context_parallel = 1;
  std::string context_parallel_mode = "p2p";  // "p2p" | "all_gather" | "all_to_all"
};

// QLoRA's 4-bit frozen base (model/quant/quantized_base.h): transformers' BitsAndBytesConfig keys, with
// its meanings (docs/qlora.md). The 8-bit (LLM.int8) keys are accepted at values that change nothing.
struct QuantizationConfig {
  bool load_in_4bit = false;
  bool load_in_8bit = false;                      // refused when true
  std::string bnb_4bit_quant_type = "fp4";        // "nf4" | "fp4" (transformers' default: fp4)
  bool bnb_4bit_use_double_quant = false;
  std::string bnb_4bit_compute_dtype = "auto";    // "auto" (the run's compute dtype) | "float32" | "bfloat16" | "float16"
  std::string bnb_4bit_quant_storage = "uint8";   // the packed codes' tensor dtype: "uint8" only
  std::string quant_method = "bitsandbytes";
  std::vector<std::string> llm_int8_skip_modules; // modules kept out of 4-bit: refused unless empty
  double llm_int8_threshold = 6.0;                // LLM.int8's outlier threshold: no effect on 4-bit
  bool llm_int8_has_fp16_weight = false;          // LLM.int8 only: no effect on 4-bit
  bool llm_int8_enable_fp32_cpu_offload = false;  // refused when true (device_map offload)
};

struct TrainConfig {
  int64_t micro_batch = 8;         // train_micro_batch_size_per_gpu (0 until resolve_for derives it)
  int64_t grad_accum = 1;          // gradient_accumulation_steps (0 until resolve_for derives it)
  int64_t train_batch_size = 0;    // optional; 0 when not given
  double gradient_clipping = 1.0;  // 0 disables
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  model::LlamaConfig model;
  std::string model_preset;        // for the record
  std::string init;                // HF directory (config.json + model.safetensors) to start from
  DataConfig data;
  int64_t steps = 100;
  uint64_t seed = 1234;
  int64_t eval_interval = 0;       // 0: evaluate only at the end (if data.val is set)
  int64_t log_interval = 1;
  std::string out_dir = "runs/default";
  int threads = 0;                 // libtorch threads per rank; 0: cores / local ranks
  int64_t checkpoint_interval = 0; // also save a checkpoint every this many steps (0: only at the end)
  int checkpoint_keep = 2;         // sharded checkpoints kept in out_dir/checkpoints (the newest)
  bool checkpoint_async = false;   // write checkpoint shards on a thread while training goes on (train/checkpoint.h)
  double device_memory = 0;        // bytes per rank; > 0: refuse to start when the plan does not fit
  std::string machine_profile;     // `shardlm bench machine` profile: plan.json predicts the step's seconds
  bool resume = true;              // continue from the newest good checkpoint in out_dir/checkpoints
  CommConfig comm;
  FlightRecorderConfig flight_recorder;
  DdpConfig ddp;
  ZeroConfig zero;
  bool bf16 = false;                      // bf16.enabled
  // DeepSpeed's bf16 masters (bf16.bf16_master_weights_and_grads) and moments (bf16.bf16_optimizer_states):
  // resolve_deepspeed_values (config_deepspeed.cpp) reads them onto optimizer.master_precision,
  // master_rounding, state_precision and data_types.grad_accum_dtype; check_relations refuses the rest.
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
  std::string bf16_cpu_products = "auto"; // bf16.cpu_products: "auto" | "native" | "fp32" (model/fp32_products.h)
  Fp16Config fp16;
  std::string grad_accum_dtype = "fp32";  // data_types.grad_accum_dtype: "fp32" | "bf16"
  std::string device = "cpu";             // "cpu" | "cuda" (rank r uses GPU local_rank mod GPUs)
  std::string attn_implementation = "auto";  // "auto" | "sdpa" | "eager" (model/attention.h)
  ActivationCheckpointingConfig activation_checkpointing;
  ParallelismConfig parallelism;
  LoraConfig lora;
  QuantizationConfig quantization;
  DebugConfig debug;
  // DeepSpeed's monitors that shardlm writes (observe/monitors.h, docs/monitoring.md).
  observe::MonitorConfig tensorboard, csv_monitor;
  // Not a config-file key; for tests: float64 parameters compare layouts without rounding noise.
  bool float64_for_tests = false;
  // Not config-file keys: train_batch_size was "auto" (resolve_for fills in the product so that
  // train_config.json shows it), and one-line notices about DeepSpeed keys read (an "auto" filled
  // in, a key accepted without effect), which the trainer logs once at start.
  bool train_batch_size_auto = false;
  std::vector<std::string> notices;

  // Checks relations that need the job's size: the model split divides it, and the batch
  // arithmetic over the data-parallel size it leaves.
  void validate_for(int world_size) const;
  // DeepSpeed's batch arithmetic: derives whichever of train_batch_size,
  // train_micro_batch_size_per_gpu and gradient_accumulation_steps the config left out (0 after
  // load_train_config) from the others and the data-parallel size, refusing values that do not
  // divide; then validate_for. Run wherever validate_for runs first (config_batch.cpp).
  void resolve_for(int world_size);
  // comm.backend with "auto" resolved: nccl on cuda, mpi on cpu.
  std::string comm_backend() const { return comm.backend != "auto" ? comm.backend : device == "cuda" ? "nccl" : "mpi"; }
};

// Reads `path` (may be empty: defaults), applies overrides of the form "a.b=value" (value parsed
// as JSON when it parses, else taken as a string), and validates every key.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);

// The resolved configuration as JSON (written to out_dir for reproducibility).
std::string config_to_json(const TrainConfig& cfg);

// The run's precision (precision/policy.h), from bf16.enabled / fp16.enabled / float64_for_tests.
precision::Policy precision_of(const TrainConfig& cfg);
// The attention kernel the run uses (attn_implementation resolved for the device and dtype).
model::Attention attention_for(const TrainConfig& cfg);

}  // namespace shardlm::train
