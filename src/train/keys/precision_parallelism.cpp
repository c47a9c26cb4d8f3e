// The bf16, fp16, data_types, activation_checkpointing and parallelism sections: compute dtype, loss
// scaling, the gradient accumulator's dtype (precision/), recompute (model/recompute.h), and tensor,
// sequence, pipeline, hybrid-shard and expert parallelism (parallel/parallelize.h).
#include "train/keys/sections.h"

#include "train/keys/rows.h"

namespace shardlm::train::keys {
namespace {

bool fp16_on(const TrainConfig& c) { return c.fp16.enabled; }

}  // namespace

// The bf16, fp16 and data_types sections: compute dtype, loss scaling and the gradient accumulator's dtype
// (precision/).
std::vector<ConfigKey> precision() {
  return {
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
    noted<bool>("fp16.auto_cast",
                "casts floating-point forward inputs to fp16; a language model's inputs are token ids, which it "
                "leaves alone (DeepSpeed's engine._cast_inputs_half)"),
    key(D, "data_types.grad_accum_dtype", FIELD(grad_accum_dtype), "dtype of the persistent ZeRO gradient shard")
        .choice("fp32").choice("bf16"),
  };
}

// The activation_checkpointing section: shardlm's recompute mode, and the deepspeed.checkpointing keys
// that change nothing (model/recompute.h).
std::vector<ConfigKey> activation_checkpointing() {
  return {
    key(OWN, "activation_checkpointing.mode", FIELD(activation_checkpointing.mode),
        "recompute in backward instead of keeping (Activation checkpointing)")
        .choice("none").choice("full").choice("selective"),
    noted<bool>("activation_checkpointing.partition_activations",
                "DeepSpeed's checkpointing API (deepspeed.checkpointing), which a model calls itself; shardlm's "
                "recompute is activation_checkpointing.mode"),
    noted<bool>("activation_checkpointing.contiguous_memory_optimization",
                "deepspeed.checkpointing's buffer layout; recompute is activation_checkpointing.mode"),
    noted<bool>("activation_checkpointing.cpu_checkpointing",
                "deepspeed.checkpointing's host copies; recompute is activation_checkpointing.mode"),
    noted<int64_t>("activation_checkpointing.number_checkpoints",
                   "deepspeed.checkpointing's buffer count; recompute is activation_checkpointing.mode"),
    noted<bool>("activation_checkpointing.synchronize_checkpoint_boundary",
                "deepspeed.checkpointing's synchronization; recompute is activation_checkpointing.mode"),
    noted<bool>("activation_checkpointing.profile", "deepspeed.checkpointing's timers"),
  };
}

// The parallelism section: tensor, sequence, pipeline, hybrid-shard and expert parallelism
// (parallel/parallelize.h).
std::vector<ConfigKey> parallelism() {
  return {
    key(OWN, "parallelism.tensor_parallel", FIELD(parallelism.tensor_parallel),
        "Megatron column/row split of every layer over adjacent ranks; dp = ranks / (tp × pp)")
        .at_least(1),
    key(OWN, "parallelism.sequence_parallel", FIELD(parallelism.sequence_parallel),
        "with tensor_parallel > 1: norms and residuals split along the sequence"),
    key(OWN, "parallelism.pipeline_parallel", FIELD(parallelism.pipeline_parallel),
        "stages of consecutive layers (Pipeline parallelism)")
        .at_least(1),
    key(OWN, "parallelism.pipeline_schedule", FIELD(parallelism.pipeline_schedule), "pipeline schedule")
        .choice("gpipe").choice("1f1b").choice("interleaved_1f1b").choice("zb_h1"),
    key(OWN, "parallelism.virtual_pipeline_parallel", FIELD(parallelism.virtual_pipeline_parallel),
        "model chunks per pipeline rank for interleaved_1f1b (Megatron's virtual_pipeline_model_parallel_size); "
        "rank s holds chunks s, s + p, ...")
        .at_least(1),
    key(OWN, "parallelism.hybrid_shard", FIELD(parallelism.hybrid_shard),
        "ZeRO stages 1-3 shard within groups of shard_group_size data-parallel ranks and replicate across "
        "groups, gradients all-reduced between them (FSDP's HYBRID_SHARD; Hybrid sharding)"),
    key(OWN, "parallelism.shard_group_size", FIELD(parallelism.shard_group_size),
        "with hybrid_shard: data-parallel ranks per shard group, a divisor of the data-parallel size")
        .at_least(0).hint("0: the data-parallel ranks of one node"),
    key(OWN, "parallelism.expert_parallel", FIELD(parallelism.expert_parallel),
        "mixture-of-experts models: each sparse layer's experts split over this many data-parallel ranks, tokens "
        "sent to them by all_to_all (Megatron's expert_model_parallel_size; Expert parallelism)")
        .at_least(1),
    key(OWN, "parallelism.context_parallel", FIELD(parallelism.context_parallel),
        "every sequence split over this many ranks in 2 × c load-balanced chunks (rank i: chunks i and 2c-1-i), "
        "ranks tp, cp, dp, pp innermost first; gradients averaged over dp × cp (Long context)")
        .at_least(1),
    key(OWN, "parallelism.context_parallel_mode", FIELD(parallelism.context_parallel_mode),
        "how context-parallel ranks exchange keys and values (Megatron's cp_comm_type)")
        .choice("p2p", "ring: K/V blocks pass rank to rank by send/recv, overlapped with attention")
        .choice("all_gather", "every rank gathers all K/V once per layer")
        .choice("all_to_all", "DeepSpeed-Ulysses: sequence split to head split and back; heads divisible by c"),
    key(OWN, "parallelism.pipeline_split", FIELD(parallelism.pipeline_split),
        "decoder layers per stage; empty: the split whose busiest stage computes least (a layer costing its matrix "
        "products, the head its vocabulary product)"),
  };
}

}  // namespace shardlm::train::keys
