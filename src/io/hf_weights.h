// The weights of a Hugging Face model directory as transformers' save_pretrained leaves them: one
// model.safetensors, or shards listed by model.safetensors.index.json (every model over a few GB on
// the Hub: Llama 3 8B has 4). Every listed tensor must be in the file the index names, and no file
// may hold a tensor the index does not list.
#pragma once
#include <string>

#include "io/safetensors.h"

namespace shardlm::io {

// Reads them all (CPU, stored dtypes); `source` is set to what was read, for messages.
NamedTensors load_hf_weights(const std::string& dir, std::string* source = nullptr);

}  // namespace shardlm::io
