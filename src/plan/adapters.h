// The planner's LoRA / QLoRA run (PlanRequest::lora; the trainer's lora and quantization sections,
// `shardlm plan --lora-r R [--qlora]`): what a rank holds and does when only the adapters (and
// lora.modules_to_save) train on a frozen base.
// - Model states: the trainable tensors in the order and units model::Llama::apply_lora leaves them
//   (adapter_shapes), through the ZeRO engine's own formula, so they equal memory.json exactly; the
//   frozen base apart (MemoryBreakdown::frozen_base), replicated on every rank as the trainer keeps it,
//   at the compute dtype's bytes or bitsandbytes' 4-bit bytes (plan/quantized_base.h); at ZeRO stage 3
//   split over the shard group (parallel/zero/sharded_frozen_base.h), its largest tensor gathered at a
//   time in the gathered working set.
// - Activations: what autograd keeps when the base is frozen (lora_activation_parts), and backward's
//   temporaries (lora_backward_peak); with QLoRA one dequantized weight at a time.
// - Time: the frozen linears' backward computes dX only; the adapters' products; QLoRA's
//   dequantization before each use, in forward and in backward (add_adapter_work).
// Tensor, pipeline, expert and context parallelism with LoRA are refused, as the trainer does.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/llama.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"

namespace shardlm::plan {

// The trainable tensors (adapters' A [r, in] and B [out, r], the modules trained in full) with the
// units they join, and the frozen ones, as apply_lora arranges them.
struct AdapterShapes {
  model::ModelShape trainable, frozen;
};
AdapterShapes adapter_shapes(const model::LlamaConfig& cfg, const model::LoraOptions& options);

// Whether base tensor `hf_name` trains (every one without LoRA; with it, lora.modules_to_save's).
bool lora_trains_in_full(const PlanRequest& r, const std::string& hf_name);
// Refuses what it does not price with LoRA (tp, pp, ep, cp > 1; a bare parameter count).
void check_lora_request(const PlanRequest& r);
// The trainer's request as the planner can price it: the trainer runs LoRA under tensor, pipeline and
// context parallelism, which the planner does not price yet, so such a run is planned as the full fine-tuning
// of the same model in the compute dtype, an upper bound; any other request is returned as it is.
PlanRequest as_the_planner_prices(PlanRequest r);
// The frozen base's bytes on one rank: replicated, or at ZeRO stage 3 its piece over `shards` ranks.
int64_t planned_frozen_base_bytes(const PlanRequest& r, int stage = 0, int shards = 1);
// ZeRO stage 3 over `shards` > 1 ranks: the largest frozen tensor gathered at a time (the compute-dtype
// weight, or the gathered 4-bit pieces and the storage rebuilt from them); 0 otherwise.
int64_t gathered_frozen_bytes(const PlanRequest& r, int stage, int shards);
// The trainable tensors' model states at ZeRO `stage` over `shards` ranks (the engine's formula).
MemoryBreakdown adapter_model_states(const PlanRequest& r, int stage, int shards);
// The trainable tensors' flat layout over `shards` ranks (comm buffers, the gathered working set).
parallel::FlatLayout adapter_layout(const PlanRequest& r, int shards);
// Replaces m's activations, recompute_peak and backward_peak by a LoRA run's and sets frozen_base and
// (QLoRA) backward_reusable: the heap holes the plain linears leave when they are quantized; at ZeRO
// stage 3 the frozen base's piece over `shards` ranks and its gathered tensor in gathered_peak.
void set_lora_memory(const PlanRequest& r, int stage, int shards, MemoryBreakdown& m);

// One micro-batch's activation bytes kept for backward with the base frozen (recompute none), and
// backward's temporaries beyond them.
int64_t lora_activations_held(const PlanRequest& r);
int64_t lora_backward_peak(const PlanRequest& r);
// The largest dequantized weight QLoRA builds at a time (its fp32 form, the compute-dtype copy and
// the fp32 absmax), 0 without load_in_4bit.
int64_t dequantized_layer_bytes(const PlanRequest& r);

// Per micro-batch, one decoder layer's adapter products (forward; backward dX and dW of A and B) and
// QLoRA's dequantization passes (one before each frozen product, forward and backward).
struct AdapterWork {
  double forward = 0, backward = 0, recompute = 0, weight_backward = 0, model_flops = 0;
};
AdapterWork adapter_layer_work(const PlanRequest& r, int64_t layer, const MachineProfile& mp);

// One line for `plan`'s text: r, adapted linears, trainable of all parameters, the base's format.
std::string lora_summary(const Plan& p);
// null without LoRA; else {"lora": {...}, "quantization": {...}} as a training config holds them.
nlohmann::json lora_json(const PlanRequest& r);

}  // namespace shardlm::plan
