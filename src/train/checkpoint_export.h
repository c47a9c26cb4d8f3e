// A Hugging Face model directory from a sharded checkpoint (`shardlm export --run DIR`), streamed
// tensor by tensor: each HF tensor is assembled from its pieces (checkpoint_reader.h), converted and
// written before the next is read, so no process ever holds the whole model. One model.safetensors,
// or HF's sharded form (model-0000k-of-0000N.safetensors + model.safetensors.index.json) when
// max_shard_bytes > 0.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace shardlm::train {

struct ExportResult {
  std::string checkpoint;  // the directory exported
  int64_t tensors = 0, bytes = 0, files = 0;
};

// Refuses an out_dir equal to or inside the run's checkpoints (its own source).
ExportResult export_checkpoint(const std::string& run_dir, const std::string& out_dir, at::ScalarType dtype,
                               int64_t max_shard_bytes);

}  // namespace shardlm::train
