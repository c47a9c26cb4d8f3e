// The plan as JSON (`shardlm plan --json`, category names as in the trainer's memory.json, which
// tests compare with it) and the recommendation as a training config (`--emit-config`).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "plan/adapters.h"
#include "plan/plan_internal.h"

namespace shardlm::plan {

namespace {
nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"compute_params", m.compute_params},     {"gradients", m.gradients},
          {"master_params", m.master_params},       {"optimizer_states", m.optimizer_states},
          {"activations", m.activations},           {"recompute_peak", m.recompute_peak},
          {"comm_buffers", m.comm_buffers},         {"gathered_peak", m.gathered_peak},
          {"backward_peak", m.backward_peak},       {"backward_reusable", m.backward_reusable},
          {"offloaded", m.offloaded},               {"host", m.host},
          {"frozen_base", m.frozen_base},
          {"total_model_states", m.model_states()}, {"total", m.total()}};
}
}  // namespace

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    auto j = memory_json(s.memory);
    j["stage"] = s.stage;
    j["fits"] = s.fits;
    j["headroom"] = s.headroom;
    j["comm_bytes_per_step"] = s.comm_bytes;
    j["comm_model_multiple"] = s.comm_model_multiple;
    if (!p.pipeline_stages.empty()) j["peak_pipeline_stage"] = s.peak_pipeline_stage;
    stages.push_back(j);
  }
  // Per pipeline stage: what it runs and holds, and its memory at each ZeRO stage planned.
  nlohmann::json pipeline = nlohmann::json::array();
  for (const auto& ps : p.pipeline_stages) {
    nlohmann::json memory = nlohmann::json::array();
    for (size_t i = 0; i < ps.memory.size() && i < p.stages.size(); ++i) {
      auto j = memory_json(ps.memory[i]);
      j["zero_stage"] = p.stages[i].stage;
      memory.push_back(j);
    }
    pipeline.push_back({{"stage", ps.stage},
                        {"first_unit", ps.first_unit},
                        {"last_unit", ps.last_unit},
                        {"layers", ps.layers},
                        {"embedding", ps.first_unit == 0},
                        {"head", ps.stage + 1 == static_cast<int>(p.pipeline_stages.size())},
                        {"embedding_copy", ps.embedding_copy},
                        {"parameters", ps.parameters},
                        {"micro_batches_alive", ps.micro_batches_alive},
                        {"memory", memory}});
  }
  const auto& r = p.request;
  return {{"model", r.model_name},
          {"parameters", p.parameters},
          {"parameters_per_rank", p.rank_parameters},
          {"devices", r.devices},
          {"dp", p.dp},
          {"shard", p.request.shard > 0 ? p.request.shard : p.dp},
          {"tp", r.tp},
          {"sequence_parallel", r.sequence_parallel},
          {"pp", r.pp},
          {"device_memory", r.device_memory},
          {"micro_batch", r.micro_batch},
          {"seq_len", r.seq_len},
          {"accumulation", r.accumulation},
          {"precision", r.precision},
          {"products_in_fp32", r.products_in_fp32},
          {"recompute", r.recompute},
          {"lora", lora_json(r)},
          {"activation_method", p.activation_method},
          {"pipeline_bubble", p.pipeline_bubble},
          {"pipeline_schedule", r.pipeline_schedule},
          {"pipeline_stages", pipeline},
          {"stages", stages},
          {"recommendation",
           {{"zero_stage", p.recommended_stage},
            {"tp", p.recommended_tp},
            {"sequence_parallel", p.recommended_sequence_parallel},
            {"pp", p.recommended_pp},
            {"recompute", p.recommended_recompute},
            {"reasons", p.reasons}}}};
}

nlohmann::json recommended_config(const Plan& p) {
  const auto& r = p.request;
  // A preset by name; anything else (a training run's model fields, an init directory) written out.
  const auto presets = model::preset_names();
  nlohmann::json model = {{"preset", r.model_name}};
  if (std::find(presets.begin(), presets.end(), r.model_name) == presets.end()) model = model::to_hf_json(r.model);
  for (const char* k : {"architectures", "torch_dtype"}) model.erase(k);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", r.micro_batch},
                        {"gradient_accumulation_steps", r.accumulation},
                        {"gradient_clipping", r.gradient_clipping},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
                        {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 100}, {"cos_min_ratio", 0.1}}}}},
                        {"model", model},
                        {"data", {{"train", "data/brown/train.bin"}, {"val", "data/brown/val.bin"}, {"seq_len", r.seq_len}}},
                        {"zero_optimization", {{"stage", p.recommended_stage}}},
                        {"activation_checkpointing", {{"mode", p.recommended_recompute}}},
                        {"parallelism",
                         {{"tensor_parallel", p.recommended_tp},
                          {"sequence_parallel", p.recommended_sequence_parallel},
                          {"pipeline_parallel", p.recommended_pp},
                          {"pipeline_schedule", r.pipeline_schedule}}},
                        {"steps", 1000}};
  if (p.recommended_pp == r.pp && !r.pipeline_split.empty())
    cfg["parallelism"]["pipeline_split"] = r.pipeline_split;
  if (p.recommended_stage > 0 && r.shard > 0)
    cfg["parallelism"]["hybrid_shard"] = true, cfg["parallelism"]["shard_group_size"] = r.shard;
  if (r.cp > 1)  // the layout's context parallelism (plan --cp or --search's choice)
    cfg["parallelism"]["context_parallel"] = r.cp, cfg["parallelism"]["context_parallel_mode"] = r.cp_mode;
  if (p.recommended_stage > 0 && r.precision == "bf16") cfg["bf16"] = {{"enabled", true}};
  if (p.recommended_stage > 0 && r.precision == "fp16") cfg["fp16"] = {{"enabled", true}};
  if (r.lora) cfg.update(lora_json(r));  // the lora (and quantization) sections as the trainer reads them
  if (r.optimizer_state_precision != "fp32") cfg["optimizer"]["state_precision"] = r.optimizer_state_precision;
  if (r.optimizer_state_precision == "8bit") cfg["optimizer"]["min_8bit_size"] = r.min_8bit_size;
  if (cfg.contains("bf16") && r.master_precision == "bf16")  // bf16 masters exist under bf16 compute only
    cfg["optimizer"]["master_precision"] = "bf16", cfg["optimizer"]["master_rounding"] = r.master_rounding;
  return cfg;
}

}  // namespace shardlm::plan
