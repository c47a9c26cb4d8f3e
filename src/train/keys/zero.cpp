// The zero_optimization section (parallel/zero/): the stage, buckets, prefetch and persistence, the
// ZeRO-3 limits DeepSpeed has and shardlm does not need, the offloads (offload_optimizer,
// offload_param and their older spellings), ZeRO++ and MiCS.
#include "train/keys/sections.h"

#include "train/keys/rows.h"

namespace shardlm::train::keys {

// The zero_optimization section's own keys: the stage, buckets, prefetch and persistence, and the ZeRO-3
// limits DeepSpeed has and shardlm does not need (parallel/zero/).
std::vector<ConfigKey> zero() {
  return {
    key(D, "zero_optimization.stage", FIELD(zero.stage), "what ZeRO shards over the data-parallel ranks")
        .choice(0, "plain data parallelism, the ddp section").choice(1, "optimizer states").choice(2, "and gradients")
        .choice(3, "and parameters"),
    key(D, "zero_optimization.reduce_bucket_size", FIELD(zero.reduce_bucket_size),
        "elements per coalesced gradient reduce-scatter, at most the largest unit")
        .above(0).hint("elements"),
    key(D, "zero_optimization.allgather_bucket_size", FIELD(zero.allgather_bucket_size),
        "elements the post-step parameter refresh coalesces")
        .above(0).hint("elements"),
    key(D, "zero_optimization.overlap_comm", FIELD(zero.overlap_comm), "overlap communication with compute"),
    key(D, "zero_optimization.stage3_prefetch_bucket_size", FIELD(zero.stage3_prefetch_bucket_size),
        "ZeRO-3: elements gathered ahead of use")
        .whole("elements").at_least(0).hint("e.g. 5e7"),
    key(D, "zero_optimization.stage3_param_persistence_threshold", FIELD(zero.stage3_param_persistence_threshold),
        "ZeRO-3: units smaller than this (elements) stay gathered")
        .whole("elements").at_least(0).hint("e.g. 5e7"),
    key(NOEFFECT, "zero_optimization.contiguous_gradients", FIELD(zero.contiguous_gradients),
        "always on: gradients are copied into flat buffers"),
    only("zero_optimization.allgather_partitions", true, "the broadcast-based gather (false) is not implemented",
         "shardlm gathers updated parameters with one all-gather per unit; the broadcast-based gather "
         "(allgather_partitions=false) is not implemented. Set it to true or remove it"),
    only("zero_optimization.reduce_scatter", true, "the all-reduce-based reduction (false) is not implemented",
         "shardlm reduces gradients with reduce-scatter; the all-reduce-based reduction (reduce_scatter=false) "
         "is not implemented. Set it to true or remove it"),
    key(D, "zero_optimization.sub_group_size", FIELD(zero.sub_group_size),
        "elements per optimizer-step tile: with offload_optimizer.device nvme the states stream through the disk "
        "in chunks of min(this, 65536) elements; with offload_optimizer.device cpu the host optimizer steps chunks of "
        "min(this, 2^22) elements; otherwise shardlm steps per unit (no effect on the arithmetic)")
        .at_least(0),
    key(NOEFFECT, "zero_optimization.round_robin_gradients", FIELD(zero.round_robin_gradients),
        "gradient copy order (an offload optimisation)"),
    key(NOEFFECT, "zero_optimization.stage3_max_live_parameters", FIELD(zero.stage3_max_live_parameters),
        "not enforced: the gathered set follows the prefetch size and persistence threshold")
        .at_least(0),
    key(NOEFFECT, "zero_optimization.stage3_max_reuse_distance", FIELD(zero.stage3_max_reuse_distance),
        "not enforced: each unit is released after its use")
        .at_least(0),
    key(NOEFFECT, "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        FIELD(zero.stage3_gather_16bit_weights_on_model_save), "shardlm always saves the full HF model"),
    alias("zero_optimization.stage3_gather_fp16_weights_on_model_save",
          "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
    key(NOEFFECT, "zero_optimization.ignore_unused_parameters", FIELD(zero.ignore_unused_parameters),
        "a Llama has none"),
    key(NOEFFECT, "zero_optimization.stage3_model_persistence_threshold",
        FIELD(zero.stage3_model_persistence_threshold),
        "not enforced: the per-unit stage3_param_persistence_threshold decides what stays gathered")
        .at_least(0),
    alias("zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"),
    alias("zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold"),
    alias("zero_optimization.model_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold"),
    alias("zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"),
    alias("zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance"),
    alias("zero_optimization.gather_16bit_weights_on_model_save",
          "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
  };
}

// zero_optimization's offloads (offload_optimizer, offload_param, their older spellings), ZeRO++ and
// MiCS (parallel/zero/state_offload.h, param_offload.h).
std::vector<ConfigKey> zero_offload() {
  return {
    key(D, "zero_optimization.offload_optimizer.device", FIELD(zero.offload_optimizer.device),
        "optimizer-state offload: nvme keeps the fp32 masters (16-bit compute) and Adam moments in files under "
        "nvme_path, streamed through O_DIRECT buffers at each step (ZeRO stages 1-3, losses bit-identical to no "
        "offload); cpu on a CPU run steps the states in host memory through the host optimizer (ZeRO stages 1-3, "
        "chunked multi-threaded CPU AdamW, bit-identical to none; not Lamb); cpu on a CUDA run (ZeRO stages 1-3) "
        "keeps the masters and moments in host memory only and copies the gradients down and the parameters up "
        "through pinned buffers on side streams around that step, and nvme on a CUDA run streams them from the "
        "files through the same copies (neither yet run on a GPU)")
        .choice("none").choice("cpu").choice("nvme"),
    key(D, "zero_optimization.offload_optimizer.nvme_path", FIELD(zero.offload_optimizer.nvme_path),
        "with device nvme: the directory of the offloaded state files (a local disk; checked before training: "
        "exists, writable, free space for the states)"),
    key(D, "zero_optimization.offload_optimizer.buffer_count", FIELD(zero.offload_optimizer.buffer_count),
        "with device nvme: chunk buffers the states stream through (one read ahead, one stepping, writes in "
        "flight); at least 2")
        .at_least(0),
    key(NOEFFECT, "zero_optimization.offload_optimizer.pin_memory", FIELD(zero.offload_optimizer.pin_memory),
        "page-locked host buffers for GPU copies; shardlm always pins the host optimizer's buffers on a CUDA run, "
        "and a CPU run copies nothing to a GPU"),
    key(NOEFFECT, "zero_optimization.offload_optimizer.pipeline_read", FIELD(zero.offload_optimizer.pipeline_read),
        "DeepSpeed's NVMe read overlap; shardlm always reads the next chunk while one steps"),
    key(NOEFFECT, "zero_optimization.offload_optimizer.pipeline_write", FIELD(zero.offload_optimizer.pipeline_write),
        "DeepSpeed's NVMe write overlap; shardlm always writes chunks back asynchronously"),
    key(NOEFFECT, "zero_optimization.offload_optimizer.fast_init", FIELD(zero.offload_optimizer.fast_init),
        "DeepSpeed's faster start of NVMe offload; shardlm writes the initial states once, chunk by chunk, either "
        "way"),
    key(NOEFFECT, "zero_optimization.offload_optimizer.ratio", FIELD(zero.offload_optimizer.ratio),
        "share of the states stepped on the CPU; on a CPU run all of them are")
        .within(0, 1),
    key(NOEFFECT, "zero_optimization.offload_optimizer.super_offload", FIELD(zero.offload_optimizer.super_offload),
        "a GPU-superchip offload path; a CPU run copies nothing"),
    key(NOEFFECT, "zero_optimization.offload_optimizer.cpuadam_cores_perc",
        FIELD(zero.offload_optimizer.cpuadam_cores_perc), "cores of super_offload's CPU Adam; threads sets shardlm's")
        .within(0, 1),
    key(D, "zero_optimization.offload_param.device", FIELD(zero.offload_param.device),
        "parameter offload (ZeRO-Infinity), ZeRO stage 3 only: nvme keeps the compute-dtype shards of the sharded "
        "units in files under nvme_path, read ahead of each unit's gather inside the prefetch window and written "
        "back by the step; cpu on a CPU run is accepted, the parameters already live in host memory; on a CUDA "
        "run both keep the shards in pinned host memory (nvme: files read through host bounce buffers), copied "
        "up into the gather buffers inside the prefetch window (not yet run on a GPU); with pipeline or expert "
        "parallelism every engine (each stage's, the experts') offloads its own units")
        .choice("none").choice("cpu").choice("nvme"),
    key(D, "zero_optimization.offload_param.nvme_path", FIELD(zero.offload_param.nvme_path),
        "with device nvme: the directory of the parameter files (a local disk; checked before training: exists, "
        "writable, room for the files)"),
    key(D, "zero_optimization.offload_param.buffer_count", FIELD(zero.offload_param.buffer_count),
        "with device nvme: parameter shards in memory at once while the optimizer step streams them (>= 2)")
        .at_least(0),
    key(D, "zero_optimization.offload_param.buffer_size", FIELD(zero.offload_param.buffer_size),
        "with device nvme: elements of the largest unit shard allowed (as DeepSpeed, every shard must fit one "
        "buffer; a larger one is refused naming it)")
        .at_least(0),
    key(D, "zero_optimization.offload_param.max_in_cpu", FIELD(zero.offload_param.max_in_cpu),
        "with device nvme: elements of the first sharded units' shards kept in host memory (DeepSpeed's meaning; "
        "its default 1e9 keeps a small model wholly in memory: set 0 to offload every sharded unit)")
        .at_least(0),
    key(NOEFFECT, "zero_optimization.offload_param.pin_memory", FIELD(zero.offload_param.pin_memory),
        "page-locked host buffers for GPU copies; a CPU run copies nothing"),
    offload_flag("zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device",
                 [](TrainConfig& c) -> std::string& { return c.zero.offload_optimizer.device; }),
    offload_flag("zero_optimization.cpu_offload_params", "zero_optimization.offload_param.device",
                 [](TrainConfig& c) -> std::string& { return c.zero.offload_param.device; }),
    offload_flag("zero_optimization.cpu_offload_param", "zero_optimization.offload_param.device",
                 [](TrainConfig& c) -> std::string& { return c.zero.offload_param.device; }),
    noted<bool>("zero_optimization.cpu_offload_use_pin_memory",
                "older pin_memory of both offloads; a CPU run copies nothing"),
    refused("zero_optimization.zenflow", "object", [](const json&) { return false; }, "absent",
            "ZenFlow is not implemented",
            "ZenFlow (stale, top-k selective optimizer updates) changes the update arithmetic and is not "
            "implemented in shardlm; remove it"),
    refused("zero_optimization.zero_quantized_weights", "bool", is_false, "false", "ZeRO++ qwZ is not implemented",
            "quantized weight communication (ZeRO++ qwZ) is not implemented in shardlm; remove it"),
    refused("zero_optimization.zero_quantized_gradients", "bool", is_false, "false", "ZeRO++ qgZ is not implemented",
            "quantized gradient communication (ZeRO++ qgZ) is not implemented in shardlm; remove it"),
    refused("zero_optimization.zero_quantized_nontrainable_weights", "bool", is_false, "false",
            "ZeRO++ quantized non-trainable weights are not implemented",
            "quantized non-trainable weights (ZeRO++) are not implemented in shardlm; remove it"),
    refused("zero_optimization.zero_hpz_partition_size", "integer",
            [](const json& v) { return v.is_number() && v.get<double>() <= 1; }, "<= 1 (1: no hpZ)",
            "ZeRO++ hpZ is not implemented",
            "hierarchical secondary partitions (ZeRO++ hpZ) are not implemented in shardlm; remove it"),
    refused("zero_optimization.zeropp_loco_param", "object", [](const json&) { return false; }, "absent",
            "LoCo-ZeRO++ is not implemented (DeepSpeed 0.19.8 removed it)",
            "LoCo error feedback for ZeRO++ quantized gradients is not implemented in shardlm, and DeepSpeed "
            "0.19.8 removed it; remove it"),
    key(D, "zero_optimization.mics_shard_size", FIELD(zero.mics_shard_size),
        "MiCS: ZeRO-3 shards within groups of this many data-parallel ranks and replicates across them, as "
        "parallelism.hybrid_shard with that shard_group_size (Hybrid sharding); <= 0: off")
        .hint("-1: off")
        // DeepSpeed 0.19.8 removed MiCS and refuses the key, so train_config.json names it only when on.
        .written_if([](const TrainConfig& c) { return c.zero.mics_shard_size > 0; }),
    refused("zero_optimization.mics_hierarchical_params_gather", "bool", is_false, "false",
            "MiCS is not implemented", "MiCS hierarchical gathers are not implemented in shardlm; remove it"),
  };
}

}  // namespace shardlm::train::keys
