// See tp_layout.h.
#include "parallel/tensor/tp_layout.h"

#include <ATen/ATen.h>

#include "model/llama.h"
#include "util/error.h"

namespace shardlm::parallel::tp {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A column-parallel product's bias is split with its output rows; a row-parallel product's bias is
// replicated and added once after the partial products are summed (model/llama.cpp).
// A sparse layer's router, experts and shared expert are replicated like the norms (model/llama.cpp
// runs the MoE block outside the parallel regions), so ".mlp.shared_expert.gate_proj" is no column.
bool is_sparse_block(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos || name.find(".mlp.shared_expert") != std::string::npos ||
         ends_with(name, ".mlp.gate.weight");
}

Split split_of(const std::string& name);

// LoRA's adapters (model/lora.h) follow their base linear W: a column-parallel W (rows split) keeps
// lora_A [r, in] whole and splits lora_B [out, r] like W's rows; a row-parallel W (columns split)
// splits lora_A's columns like W's and keeps lora_B whole (the r-wide x A^T is summed over the ranks).
const char* const kLoraA = ".lora_A.weight";
const char* const kLoraB = ".lora_B.weight";

Split base_split(const std::string& name, const char* suffix) {
  return split_of(name.substr(0, name.size() - std::string(suffix).size()) + ".weight");
}

Split split_of(const std::string& name) {
  if (ends_with(name, kLoraA)) return base_split(name, kLoraA) == Split::Columns ? Split::Columns : Split::Replicated;
  if (ends_with(name, kLoraB)) {
    const auto base = base_split(name, kLoraB);
    return base == Split::Columns ? Split::Replicated : base;
  }
  if (is_sparse_block(name)) return Split::Replicated;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return Split::Rows;
  for (const char* rows : {"q_proj.weight", "gate_proj.weight", "up_proj.weight", "q_proj.bias", "gate_proj.bias",
                           "up_proj.bias"})
    if (ends_with(name, rows)) return Split::Rows;
  for (const char* kv : {"k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias"})
    if (ends_with(name, kv)) return Split::KvRows;
  if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) return Split::Columns;
  return Split::Replicated;  // norms, o_proj.bias, down_proj.bias
}

bool is_vocab(const std::string& name) { return name == "model.embed_tokens.weight" || name == "lm_head.weight"; }

// KV heads held per rank, and how many ranks hold each.
int64_t kv_per_rank(const model::LlamaConfig& cfg, int t) { return std::max<int64_t>(1, cfg.num_key_value_heads / t); }

}  // namespace

ParamSplit param_split(const std::string& name, const model::LlamaConfig& cfg, int t, bool sequence_parallel) {
  ParamSplit p;
  p.split = split_of(name);
  if (t == 1) return p;
  if (p.split == Split::Replicated) {
    p.replicas = t;
    // Qwen3's per-head q/k norms read only this rank's heads: partial gradients with or without
    // sequence parallelism.
    // A column-parallel base's lora_A: each rank's gradient comes from its own output rows only.
    const bool column_lora_a = ends_with(name, kLoraA) && base_split(name, kLoraA) != Split::Replicated;
    p.sum_gradients = sequence_parallel || column_lora_a || ends_with(name, "self_attn.q_norm.weight") ||
                      ends_with(name, "self_attn.k_norm.weight");
  } else if (p.split == Split::KvRows && cfg.num_key_value_heads < t) {
    p.replicas = t / static_cast<int>(cfg.num_key_value_heads);
    p.sum_gradients = true;
  }
  return p;
}

void check_tensor_parallel(const model::LlamaConfig& cfg, int t, bool sequence_parallel, int64_t seq_len) {
  if (t < 1) fail("parallelism.tensor_parallel must be >= 1, got ", t);
  if (t == 1) {
    if (sequence_parallel) fail("parallelism.sequence_parallel needs parallelism.tensor_parallel > 1");
    return;
  }
  // What parallelize() runs: the planner and `plan --search` ask this same check.
  // Sequence parallelism routes each rank's own positions: a capacity (over a forward's tokens) would
  // see a part of the sequence. (The load-balancing loss sums its statistics over the group.)
  if (cfg.is_moe() && sequence_parallel && cfg.moe_capacity_factor > 0)
    fail("model.moe_capacity_factor = ", cfg.moe_capacity_factor, " with parallelism.sequence_parallel: each "
         "tensor-parallel rank routes only its part of the sequence, so the capacity would count other tokens than "
         "one process does; set parallelism.sequence_parallel to false or model.moe_capacity_factor to 0");
  const int64_t H = cfg.num_attention_heads, KV = cfg.num_key_value_heads;
  auto need = [&](bool ok, const std::string& what, int64_t n) {
    if (!ok)
      fail("parallelism.tensor_parallel=", t, " does not divide the ", what, " (", n, " / ", t, " = ",
           static_cast<double>(n) / t, "); choose a tensor-parallel size that divides ", n);
  };
  need(H % t == 0, "attention heads (num_attention_heads)", H);
  need(cfg.intermediate_size % t == 0, "MLP width (intermediate_size)", cfg.intermediate_size);
  if (padded_vocab(cfg, t) - cfg.vocab_size >= vocab_rows_per_rank(cfg, t))
    fail("parallelism.tensor_parallel=", t, " leaves the last rank no vocabulary row of ", cfg.vocab_size,
         " (padded to ", padded_vocab(cfg, t), "); choose a smaller tensor-parallel size");
  if (KV % t != 0 && t % KV != 0)
    fail("parallelism.tensor_parallel=", t, " and num_key_value_heads=", KV,
         ": the KV heads are split when t divides them and replicated on t/KV ranks each when t is a multiple of "
         "them; ",
         t, " is neither (", KV, " % ", t, " = ", KV % t, ", ", t, " % ", KV, " = ", t % KV, ")");
  if (sequence_parallel && seq_len % t != 0)
    fail("parallelism.sequence_parallel splits the sequence over the ", t, " tensor-parallel ranks, but seq_len ",
         seq_len, " / ", t, " = ", static_cast<double>(seq_len) / t, "; choose a seq_len that ", t, " divides");
}

int64_t padded_vocab(const model::LlamaConfig& cfg, int t) { return (cfg.vocab_size + t - 1) / t * t; }
int64_t vocab_rows_per_rank(const model::LlamaConfig& cfg, int t) { return padded_vocab(cfg, t) / t; }

model::ModelShape sharded_shape(const model::ModelShape& full, const model::LlamaConfig& cfg, int t) {
  auto out = full;
  for (auto& [name, shape] : out.params) {
    switch (split_of(name)) {
      case Split::Rows: shape[0] = is_vocab(name) ? vocab_rows_per_rank(cfg, t) : shape[0] / t; break;
      case Split::KvRows: shape[0] = kv_per_rank(cfg, t) * cfg.head_dim(); break;
      case Split::Columns: shape[1] /= t; break;
      case Split::Replicated: break;
    }
  }
  return out;
}

at::Tensor shard(const at::Tensor& full, const std::string& name, const model::LlamaConfig& cfg, int t, int r) {
  switch (split_of(name)) {
    case Split::Rows: {
      if (!is_vocab(name) || full.size(0) % t == 0) return full.chunk(t, 0)[r];
      // The vocabulary padded with zero rows to a multiple of t; the last ranks hold the padding.
      const int64_t rows = vocab_rows_per_rank(cfg, t), first = r * rows;
      auto piece = at::zeros({rows, full.size(1)}, full.options());
      const int64_t real = std::max<int64_t>(0, std::min(rows, full.size(0) - first));
      if (real > 0) piece.narrow(0, 0, real).copy_(full.narrow(0, first, real));
      return piece;
    }
    case Split::Columns: return full.chunk(t, 1)[r];
    case Split::KvRows: {
      const int64_t rows = kv_per_rank(cfg, t) * cfg.head_dim();
      // Rank r's query heads start at head r H/t, which reads KV head r KV/t.
      const int64_t first_kv_head = static_cast<int64_t>(r) * cfg.num_key_value_heads / t;
      return full.narrow(0, first_kv_head * cfg.head_dim(), rows);
    }
    case Split::Replicated: break;
  }
  return full;
}

at::Tensor unshard(const std::vector<at::Tensor>& pieces, const std::string& name, const model::LlamaConfig& cfg) {
  const int t = static_cast<int>(pieces.size());
  switch (split_of(name)) {
    case Split::Rows: {
      auto full = at::cat(pieces, 0);
      return is_vocab(name) ? full.narrow(0, 0, cfg.vocab_size) : full;  // the padding rows dropped
    }
    case Split::Columns: return at::cat(pieces, 1);
    case Split::KvRows: {
      if (cfg.num_key_value_heads >= t) return at::cat(pieces, 0);
      std::vector<at::Tensor> distinct;  // one copy of each KV head: the first rank of its group
      for (int r = 0; r < t; r += t / static_cast<int>(cfg.num_key_value_heads)) distinct.push_back(pieces[r]);
      return at::cat(distinct, 0);
    }
    case Split::Replicated: break;
  }
  return pieces.front();
}

}  // namespace shardlm::parallel::tp
