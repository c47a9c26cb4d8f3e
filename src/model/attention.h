// Causal self-attention, the one place the model chooses how to compute softmax(QK^T/sqrt(d))V:
//   eager: the transcription of HF's eager path (scores materialised, fp32 softmax, products
//          through model/fp32_products.h) — the reference the parity tests compare against;
//   sdpa:  the library's scaled_dot_product_attention, which picks a fused kernel (flash or
//          memory-efficient on CUDA, the flash kernel on CPU) that never stores the T x T scores.
// "auto" takes sdpa on CUDA, and on CPU whichever measured faster here (see resolve_attention).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace shardlm::model {

enum class Attention { Eager, Sdpa };

// Validates a config value: "auto" | "sdpa" | "eager".
void parse_attention(const std::string& name);
// The implementation "name" means for tensors of this device and compute dtype.
Attention resolve_attention(const std::string& name, bool cuda, at::ScalarType dtype);
const char* attention_name(Attention a);
// True when the implementation keeps no heads x T x T tensor for backward (the planner's term).
bool attention_is_fused(Attention a);

// q: [B, H, T, D]; k, v: [B, KV, T, D] with H a multiple of KV (grouped-query attention).
// window > 0: sliding-window attention as transformers masks it (masking_utils'
// sliding_window_overlay): query i sees keys j with i - window < j <= i. segments (optional, int64
// [B, T]): the sample each position belongs to in a packed row; query i then also sees only keys of
// its own sample (block-diagonal causal attention, as transformers masks packed sequences found
// from restarting position_ids: packed_sequence_mask_function and'ed with the causal/window mask).
// Returns [B, H, T, D] in q's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Attention impl,
                            int64_t window = 0, const at::Tensor& segments = {});
// Attention of the queries q [B, H, Tq, D] over the keys and values k, v [B, KV, Tk, D] (H a multiple
// of KV) with an explicit mask: blocked (bool, broadcastable to [B, H, Tq, Tk]) true where a query
// may not see a key; every query must see at least one. Context parallelism (model/context_attention.h)
// computes its chunks' masks from their places in the whole sequence and calls this.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Attention impl,
                            const at::Tensor& blocked);
// The positions query i may not see: j > i, and with a window j <= i - window. Bool [T, T].
at::Tensor attention_blocked(int64_t T, int64_t window, const at::TensorOptions& on);
// The same for packed rows: also j in another sample than i. Bool [B, 1, T, T].
at::Tensor attention_blocked(const at::Tensor& segments, int64_t window, const at::TensorOptions& on);

}  // namespace shardlm::model
