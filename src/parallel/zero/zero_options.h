// The options of the ZeRO engine (zero_engine.h): the stage, the device and precisions, the buckets,
// hybrid sharding and expert parallelism's packing, and the offload keys, as parallelize_options
// (train/config_options.cpp) sets them from the config. Apart from the engine, so that
// parallelize.h and the options' readers do not compile against the engine's internals.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel {

struct ZeroOptions {
  int stage = 1;
  // Where every buffer of the engine lives. The model's parameters may be anywhere (the trainer
  // keeps them on the CPU where they were initialised): the engine packs them into units on this
  // device and points the parameters at views of those units.
  c10::Device device = c10::Device(c10::kCPU);
  at::ScalarType compute_dtype = at::kFloat;     // parameters, activations, communicated gradients
  at::ScalarType grad_accum_dtype = at::kFloat;  // the persistent gradient shard (stages 2, 3)
  bool overlap_comm = true;                      // false: wait for each reduce-scatter at once
  int64_t prefetch_numel = 50'000'000;           // stage3_prefetch_bucket_size (elements)
  int64_t persistence_threshold = 100'000;       // stage3_param_persistence_threshold (elements)
  // reduce_bucket_size (elements): consecutive units whose full gradients fit (and fit the largest
  // unit) are reduce-scattered by one collective (zero_buckets.h); stages 1-3. 0 or
  // 0: unit by unit.
  int64_t reduce_bucket_numel = 500'000'000;
  // allgather_bucket_size (elements): after the step, persistent units whose gathered parameters
  // fit are refreshed by one all-gather (zero_gather_buckets.h); stages 1-3.
  int64_t allgather_bucket_numel = 500'000'000;
  // Per-unit loss scaling: the backward signal is rescaled at every unit boundary (see
  // set_unit_loss_scales), so each unit's gradients carry that unit's own scale.
  bool per_unit_loss_scaling = false;
  // Per parameter: the weight of its squared gradient norm in the model's norm (tensor parallelism:
  // 1/replicas, so replicated tensors count once over the TP group); empty: all 1.
  std::vector<double> grad_norm_weights;
  // Hybrid sharding (parallel_dims.h): the ranks holding the same shard in the other shard groups.
  // Units are sharded over the engine's own group only; at the accumulation boundary each reduced
  // gradient shard is summed over these replicas (one all-reduce per unit), so every replica steps
  // on the gradient of the whole data-parallel batch. Null: no replicas.
  comm::CommPtr replicas;
  // Expert parallelism (parallel/expert/expert_zero.h): when not empty, the engine packs only the
  // parameters marked here (the others are left to another engine; units may end up empty), names
  // their optimizer segments from first_element (where this rank's slice starts in the whole tensor;
  // empty: 0), and divides the reduced gradients by average_over ranks instead of its own group's
  // size (the expert gradients' edp sum over all of dp). 0: the data-parallel size.
  std::vector<char> only_params;
  std::vector<int64_t> first_element;
  int average_over = 0;
  // zero_optimization.offload_optimizer.device "nvme" (state_offload.h): fp32 masters (16-bit
  // compute) and Adam moments live in files under offload_nvme_path between steps; stages 1-3.
  bool offload_nvme = false;
  std::string offload_nvme_path;
  std::string offload_files = "states";  // names the files (expert parallelism's second engine: its own)
  // zero_optimization.offload_optimizer.device "cpu" (host_optimizer.h), stages 1-3: the step runs
  // through the host optimizer (chunked, multi-threaded CPU AdamW on the engine's own states).
  bool offload_cpu = false;
  // With offload_cpu (or offload_nvme, whose masters and moments then stream from the files through
  // the host: host_optimizer.h ChunkTransfers): the optimizer's buffers apart from the device's, as a
  // GPU needs them (always on a CUDA device): the masters (fp32 runs too: the device shard is then only the working copy) and
  // moments exist only in host memory (pinned on a GPU), the optimizer reads host gradient buffers
  // the reduced shards are copied into after the norm, clipping and overflow checks ran on the
  // device, and the updated masters are cast back into the device shards. false on a CPU device: the
  // host tensors are the device's, used in place. Tests set it on CPU to run the GPU layout.
  bool host_buffers_apart = false;
  int64_t offload_cpu_chunk_elements = int64_t{1} << 22;  // min(sub_group_size, 2^22)
  int offload_buffer_count = 4;
  int64_t offload_chunk_elements = int64_t{1} << 16;  // min(sub_group_size, 2^16)
  // zero_optimization.offload_param.device "nvme" (param_offload.h), stage 3 only: the compute shards
  // of the sharded units live in files under offload_param_path, except the first units within
  // offload_param_max_in_cpu elements (DeepSpeed's max_in_cpu); no unit's shard may exceed
  // offload_param_buffer_numel elements (buffer_size); the step streams them through
  // offload_param_buffer_count buffers.
  bool offload_param_nvme = false;
  std::string offload_param_path;
  std::string offload_param_files = "params";  // names the files (expert parallelism's second engine: its own)
  int offload_param_buffer_count = 5;
  double offload_param_buffer_numel = 1e8;
  double offload_param_max_in_cpu = 1e9;
  // zero_optimization.offload_param.device "cpu" or "nvme" at stage 3 with the sharded units' compute
  // shards in host memory apart from the device (always on a CUDA device; tests set it on CPU to run
  // the GPU layout): pinned host tensors (nvme: those within max_in_cpu, the rest in files read into
  // host bounce buffers), copied into the unit's slot of the device gather buffer inside the prefetch
  // window (shard_uploads.h) and all-gathered in place. The step updates the host shards: with
  // offload_optimizer "cpu" a host shard of the master's dtype (fp32 compute, bf16 masters) is the host
  // master itself, one buffer (nvme parameters: the master lives in the parameter files), and fp32
  // masters under 16-bit compute are cast straight into it; with "nvme" the paged masters (each piece
  // while its chunk steps; ZeRO-Infinity) are, with no staging buffer; without optimizer offload
  // the fp32 masters and moments stay on the device (fp32 compute too, as DeepSpeed's) and are copied
  // down. false on a CPU device: "cpu" parameters are already in host memory.
  bool offload_param_apart = false;
};

}  // namespace shardlm::parallel
