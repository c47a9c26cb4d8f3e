// Rotary position embeddings of every RoPE type a Llama-family config.json may ask for, as
// transformers computes them (modeling_rope_utils.py: the rope init functions, and
// dynamic_rope_update's per-forward choice): default, linear, dynamic (NTK), yarn, longrope, llama3.
// One file, so the model reads only cos/sin tables and no type is handled anywhere else.
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

#include "model/llama_config.h"

namespace shardlm::model {

// The inverse frequencies [head_dim / 2] and the attention scaling (cos and sin are multiplied by
// it) of a forward over positions 0..seq_len-1, computed in `math` (at::kFloat as transformers
// computes them; at::kDouble for a float64 model, every intermediate in float64). The choices that
// transformers re-makes each forward: dynamic recomputes the base from seq_len when it exceeds
// max_position_embeddings; longrope takes long_factor when seq_len exceeds
// original_max_position_embeddings, short_factor otherwise. (transformers' dynamic type also keeps
// the frequencies of the longest forward seen until one shorter than max_position_embeddings; a
// forward's own length decides here, which is the same for training's fixed length and for
// generation's growing one.)
std::pair<at::Tensor, double> rope_inv_freq(const LlamaConfig& cfg, int64_t seq_len, at::ScalarType math,
                                            at::Device device = at::kCPU);

// cos/sin tables [seq_len, head_dim] for positions 0..seq_len-1 (HF's "rotate_half" layout: the
// frequency vector concatenated with itself), attention scaling applied, in `math` on `device`.
std::pair<at::Tensor, at::Tensor> rope_tables(const LlamaConfig& cfg, int64_t seq_len, at::ScalarType math,
                                              at::Device device = at::kCPU);

// Whether the RoPE type defines positions beyond max_position_embeddings (dynamic rescales its base
// there); for the others a longer sequence is refused.
bool rope_extends_beyond_max_positions(const LlamaConfig& cfg);

}  // namespace shardlm::model
