// See plan_check.h.
#include "train/plan_check.h"

#include <string>

#include "parallel/expert/expert_parallel.h"
#include "plan/adapters.h"
#include "train/config_options.h"
#include "train/lora_config.h"
#include "util/available_memory.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::train {

// The planner's view of this run.
plan::PlanRequest plan_request(const TrainConfig& cfg, int devices, int zero_stage, int64_t micro_batch) {
  // Expert parallelism's bad input in the config's words (parallelism.expert_parallel), before the
  // planner's (--ep).
  parallel::ExpertParallel::check(cfg.model, cfg.parallelism.expert_parallel);
  plan::PlanRequest r;
  r.model = cfg.model;
  r.model_name = cfg.model_preset;
  r.devices = devices;
  r.device_memory = cfg.device_memory;
  r.micro_batch = micro_batch;
  r.seq_len = cfg.data.seq_len;
  r.accumulation = cfg.grad_accum;
  r.zero_stage = zero_stage;
  r.precision = precision_of(cfg).planner_name;
  r.load_in_4bit = cfg.quantization.load_in_4bit;
  r.double_quant = cfg.quantization.bnb_4bit_use_double_quant;
  r.lora = cfg.lora.enabled;  // plan/adapters.h: adapters' states, the frozen base apart
  if (r.lora) r.lora_options = lora_options(cfg.lora);
  r.grad_accum_dtype = cfg.grad_accum_dtype;
  r.gradient_clipping = cfg.gradient_clipping;
  r.optimizer_state_precision = cfg.optimizer.state_precision;
  r.min_8bit_size = cfg.optimizer.min_8bit_size;
  r.master_precision = cfg.optimizer.master_precision;
  r.master_rounding = cfg.optimizer.master_rounding;
  r.offload_optimizer_nvme = cfg.zero.offload_optimizer.device == "nvme";
  r.offload_optimizer_host = host_optimizer_apart(cfg) && !r.offload_optimizer_nvme;
  r.offload_optimizer_nvme_apart = host_optimizer_apart(cfg) && r.offload_optimizer_nvme;
  r.offload_param_nvme = cfg.zero.offload_param.device == "nvme";
  r.offload_param_host = param_offload_apart(cfg);
  r.offload_param_max_in_cpu = cfg.zero.offload_param.max_in_cpu;
  r.persistence_threshold = cfg.zero.stage3_param_persistence_threshold;
  r.prefetch = cfg.zero.stage3_prefetch_bucket_size;
  r.reduce_bucket = cfg.zero.reduce_bucket_size;
  r.fused_attention = model::attention_is_fused(attention_for(cfg));
  r.recompute = cfg.activation_checkpointing.mode;
  r.tp = cfg.parallelism.tensor_parallel;
  r.sequence_parallel = cfg.parallelism.sequence_parallel;
  r.pp = cfg.parallelism.pipeline_parallel;
  r.ep = cfg.parallelism.expert_parallel;
  r.cp = cfg.parallelism.context_parallel;
  r.cp_mode = cfg.parallelism.context_parallel_mode;
  r.shard = cfg.zero.mics_shard_size > 0 ? cfg.zero.mics_shard_size
            : cfg.parallelism.hybrid_shard ? cfg.parallelism.shard_group_size : 0;
  r.pipeline_schedule = cfg.parallelism.pipeline_schedule;
  r.virtual_pipeline = cfg.parallelism.virtual_pipeline_parallel;
  r.pipeline_split = cfg.parallelism.pipeline_split;
  r.products_in_fp32 = precision_of(cfg).products_in_fp32(cfg.device);
  return plan::as_the_planner_prices(r);  // LoRA under TP or PP: its full fine-tuning (plan/adapters.h)
}

// With device_memory set, refuses a run whose predicted peak does not fit, naming the smallest
// change that does: a higher ZeRO stage first, then a smaller micro-batch.
void check_plan_fits(const TrainConfig& cfg, int devices) {
  if (cfg.device_memory <= 0) return check_plan_fits_available_memory(cfg, devices, local_ranks(), 0);
  const auto planned = plan::make_plan(plan_request(cfg, devices, cfg.zero.stage, cfg.micro_batch));
  if (planned.stages.front().fits) return;
  std::string fix;
  for (int stage = cfg.zero.stage + 1; stage <= 3 && fix.empty(); ++stage)
    if (plan::make_plan(plan_request(cfg, devices, stage, cfg.micro_batch)).stages.front().fits)
      fix = "--zero_optimization.stage=" + std::to_string(stage);
  for (int64_t b = cfg.micro_batch / 2; b >= 1 && fix.empty(); b /= 2)
    if (plan::make_plan(plan_request(cfg, devices, cfg.zero.stage, b)).stages.front().fits)
      fix = "--train_micro_batch_size_per_gpu=" + std::to_string(b) + " (raise gradient_accumulation_steps to keep the batch)";
  // Context parallelism over the same ranks: each holds seq_len / cp positions of every sequence.
  const int beside = devices / (cfg.parallelism.tensor_parallel * cfg.parallelism.pipeline_parallel);
  for (int cp = 2 * cfg.parallelism.context_parallel; cp <= beside && fix.empty(); cp *= 2) {
    if (beside % cp != 0 || cfg.data.seq_len % (2 * cp) != 0) continue;
    auto split = cfg;
    split.parallelism.context_parallel = cp;
    if (plan::make_plan(plan_request(split, devices, cfg.zero.stage, cfg.micro_batch)).stages.front().fits)
      fix = "--parallelism.context_parallel=" + std::to_string(cp) + " (every sequence over " + std::to_string(cp) +
            " ranks; the data-parallel ranks divide by " + std::to_string(cp) + ")";
  }
  fail("the plan for this run does not fit device_memory:\n", plan::format_plan(planned),
       fix.empty() ? "no single change fits: use more devices or a smaller model" : "smallest change that fits: " + fix);
}

void check_plan_fits_available_memory(const TrainConfig& cfg, int devices, int ranks_here, int64_t per_rank_overhead) {
  const auto budget = rank_memory_budget(cfg.device, ranks_here, per_rank_overhead);
  auto limited = cfg;
  limited.device_memory = static_cast<double>(std::max<int64_t>(budget.bytes, 1));
  try {
    check_plan_fits(limited, devices);
  } catch (const Error& e) {
    fail(e.what(), "\n(device_memory is not set, so each rank may use what this machine has free: ",
         util::format_bytes(static_cast<double>(budget.bytes)), " = ", budget.why, ".) Other fixes: a smaller model, "
         "--zero_optimization.stage=3, more ranks on more nodes, --activation_checkpointing.mode=full, or set "
         "--device_memory=SIZE to plan for another amount");
  }
}

}  // namespace shardlm::train
