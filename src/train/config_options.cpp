// See config_options.h.
#include "train/config_options.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace shardlm::train {

namespace {
bool offload_apart(const TrainConfig& cfg) {
  if (cfg.device == "cuda") return true;
  const char* test = std::getenv("SHARDLM_TEST_OFFLOAD_APART");
  return test && std::string(test) == "1";
}
}  // namespace

bool host_optimizer_apart(const TrainConfig& cfg) {
  const auto& device = cfg.zero.offload_optimizer.device;
  return (device == "cpu" || device == "nvme") && cfg.zero.stage > 0 && offload_apart(cfg);
}

bool param_offload_apart(const TrainConfig& cfg) {
  return cfg.zero.offload_param.device != "none" && cfg.zero.stage == 3 && offload_apart(cfg);
}

parallel::ParallelizeOptions parallelize_options(const TrainConfig& cfg, c10::Device device) {
  const precision::Policy precision = precision_of(cfg);
  parallel::ParallelizeOptions po;
  po.sequence_parallel = cfg.parallelism.sequence_parallel;
  po.context_mode = cfg.parallelism.context_parallel_mode;
  po.pipeline_split = cfg.parallelism.pipeline_split;
  po.pipeline_schedule = parallel::pp::parse_schedule(cfg.parallelism.pipeline_schedule);
  po.virtual_pipeline = cfg.parallelism.virtual_pipeline_parallel;
  po.micro_batch = cfg.micro_batch;
  po.seq_len = cfg.data.seq_len;
  po.recompute = model::parse_recompute(cfg.activation_checkpointing.mode);
  po.ddp_bucket_bytes = static_cast<int64_t>(cfg.ddp.bucket_cap_mb * (1 << 20));
  const auto& o = cfg.optimizer;
  po.adam = optim::AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  // DeepSpeed's types (runtime/engine.py _configure_basic_optimizer): AdamW always decoupled, Adam
  // decoupled unless adam_w_mode is false, Lamb its own rule.
  po.adam.rule = o.type == "Lamb"                             ? optim::UpdateRule::Lamb
                 : o.type == "Adam" && !o.adam_w_mode         ? optim::UpdateRule::AdamL2
                                                              : optim::UpdateRule::AdamW;
  po.adam.bias_correction = o.bias_correction;
  po.adam.max_coeff = o.max_coeff, po.adam.min_coeff = o.min_coeff;
  po.adam.eps_inside_sqrt = o.eps_inside_sqrt;
  po.adam.state_precision = optim::parse_state_precision(o.state_precision);
  po.adam.min_8bit_size = o.min_8bit_size;
  po.adam.masters = optim::parse_master_format(o.master_precision, o.master_rounding);
  po.adam.seed = cfg.seed;
  auto& z = po.zero;
  z.stage = cfg.zero.stage;
  z.device = device;
  z.compute_dtype = precision.compute;
  z.grad_accum_dtype = precision.grad_accum(cfg.grad_accum_dtype);
  z.overlap_comm = cfg.zero.overlap_comm;
  z.prefetch_numel = static_cast<int64_t>(cfg.zero.stage3_prefetch_bucket_size);
  z.persistence_threshold = static_cast<int64_t>(cfg.zero.stage3_param_persistence_threshold);
  z.reduce_bucket_numel = static_cast<int64_t>(cfg.zero.reduce_bucket_size);
  z.allgather_bucket_numel = static_cast<int64_t>(cfg.zero.allgather_bucket_size);
  z.per_unit_loss_scaling = precision.loss_scaling && cfg.fp16.per_unit_loss_scaling;
  z.offload_nvme = cfg.zero.offload_optimizer.device == "nvme";
  // Stage 0 keeps whole states on every rank, already in host memory on a CPU run (a notice says so).
  z.offload_cpu = cfg.zero.offload_optimizer.device == "cpu" && cfg.zero.stage > 0;
  z.host_buffers_apart = host_optimizer_apart(cfg);  // the engine keeps them apart on any GPU anyway
  z.offload_nvme_path = cfg.zero.offload_optimizer.nvme_path;
  z.offload_buffer_count = static_cast<int>(cfg.zero.offload_optimizer.buffer_count);
  // DeepSpeed swaps NVMe-offloaded states in sub_group_size tiles; its default (1e9) would make one
  // tile of a whole model, so shardlm caps a chunk at 2^16 elements (512 KiB of fp32 moments).
  z.offload_chunk_elements = static_cast<int64_t>(std::min(cfg.zero.sub_group_size, double(int64_t{1} << 16)));
  z.offload_cpu_chunk_elements = static_cast<int64_t>(std::min(cfg.zero.sub_group_size, double(int64_t{1} << 22)));
  z.offload_param_nvme = cfg.zero.offload_param.device == "nvme";
  z.offload_param_apart = param_offload_apart(cfg);
  z.offload_param_path = cfg.zero.offload_param.nvme_path;
  z.offload_param_buffer_count = static_cast<int>(cfg.zero.offload_param.buffer_count);
  z.offload_param_buffer_numel = cfg.zero.offload_param.buffer_size;
  z.offload_param_max_in_cpu = cfg.zero.offload_param.max_in_cpu;
  return po;
}

precision::GradScalerOptions grad_scaler_options(const TrainConfig& cfg) { return cfg.fp16; }

optim::LrSchedule lr_schedule(const TrainConfig& cfg) { return {cfg.scheduler, cfg.optimizer.lr, cfg.steps}; }

}  // namespace shardlm::train
