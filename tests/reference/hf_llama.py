"""Plain-torch transcription of Hugging Face transformers' Llama-family causal LMs.

This is the reference the C++ model (shardlm) is tested against. It follows the
pinned transformers (5.23: `models/llama/modeling_llama.py`, `models/mistral/`,
`models/qwen2/`, `modeling_rope_utils.py`, `masking_utils.py`) operation by
operation on the eager attention path (no KV cache, no dropout, no padding mask),
including where HF changes dtypes, so that in float32 it produces the same
numbers HF produces (up to float rounding-order differences).

Nothing is imported from transformers (the goldens must not depend on its
version); tests/reference/check_transformers.py and make_family_cases.py run
transformers' own models on the same weights and check that both agree. The
model is a set of functions over a dict of parameters keyed by HF's exact
parameter names, in HF's `named_parameters()` order (a bias right after its
weight; biases only where the config has them, see `param_shapes`):

    model.embed_tokens.weight                         [V, H]
    model.layers.{i}.self_attn.q_proj.weight          [nH*D, H]
    model.layers.{i}.self_attn.q_proj.bias            [nH*D]    llama attention_bias / qwen2
    model.layers.{i}.self_attn.k_proj.weight          [nKV*D, H]
    model.layers.{i}.self_attn.k_proj.bias            [nKV*D]   llama attention_bias / qwen2
    model.layers.{i}.self_attn.v_proj.weight          [nKV*D, H]
    model.layers.{i}.self_attn.v_proj.bias            [nKV*D]   llama attention_bias / qwen2
    model.layers.{i}.self_attn.o_proj.weight          [H, nH*D]
    model.layers.{i}.self_attn.o_proj.bias            [H]       llama attention_bias only
    model.layers.{i}.mlp.gate_proj.weight             [I, H]
    model.layers.{i}.mlp.gate_proj.bias               [I]       llama mlp_bias only
    model.layers.{i}.mlp.up_proj.weight               [I, H]
    model.layers.{i}.mlp.up_proj.bias                 [I]       llama mlp_bias only
    model.layers.{i}.mlp.down_proj.weight             [H, I]
    model.layers.{i}.mlp.down_proj.bias               [H]       llama mlp_bias only
    model.layers.{i}.input_layernorm.weight           [H]
    model.layers.{i}.post_attention_layernorm.weight  [H]
    model.norm.weight                                 [H]
    lm_head.weight                                    [V, H]  (absent when tied)

Linear layers are nn.Linear: weight [out_features, in_features], y = x @ W^T + b.
D is the config's `head_dim` when present (it may differ from H / nH, e.g.
Mistral-Nemo), else H // nH.

The config (families, their defaults, config.json reading, parameter shapes) is
hf_llama_config.py and RoPE is hf_llama_rope.py; this module is the model and re-exports
both, so `import hf_llama` is the whole reference.

Float64 mode: if the parameters are float64, every place where HF forces
float32 (RMSNorm upcast, RoPE inv_freq / cos / sin and every RoPE-parameter
tensor computation, softmax, logits.float()) uses float64 instead, so the same
code gives a high-precision reference for the float32 path. For
float32/bf16/fp16 parameters the behaviour is exactly HF's.
"""

import torch
import torch.nn.functional as F

from hf_llama_config import (  # noqa: F401  (re-exported: hf_llama.LlamaConfig, ...)
    DEFAULT_ROPE_THETA,
    FAMILY_DEFAULTS,
    LAYER_TYPES,
    LlamaConfig,
    param_shapes,
    standardize_rope_parameters,
)
from hf_llama_rope import (  # noqa: F401  (re-exported: hf_llama.rope_init, ...)
    llama3_bands,
    rope_for_forward,
    rope_init,
    rotary_cos_sin,
    rotary_inv_freq,
)


def _upcast_dtype(dtype):
    """The dtype HF uses where it 'upcasts to float32'.

    Identical to HF (float32) for float32/fp16/bf16; float64 stays float64 so
    the float64 reference is not silently truncated.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- #
# Building blocks (one function per HF module / helper)
# --------------------------------------------------------------------------- #
def rms_norm(hidden_states, weight, eps):
    """LlamaRMSNorm.forward (Mistral's and Qwen2's are identical).

        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    Note: eps is added to the mean square *inside* the rsqrt; the weight multiply
    happens *after* casting back to the input dtype (matters for bf16/fp16).
    """
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(_upcast_dtype(input_dtype))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def rotate_half(x):
    """Rotates half the hidden dims of the input: [x1, x2] -> [-x2, x1]."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """q, k: [B, heads, T, D]; cos, sin: [B, T, D] -> broadcast over heads."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    """[B, nKV, T, D] -> [B, nKV*n_rep, T, D]; equivalent to
    torch.repeat_interleave(x, dim=1, repeats=n_rep): query head h uses kv head
    h // n_rep (NOT h % nKV)."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def causal_mask(seq_len, dtype, device=None):
    """The eager causal mask without padding: an additive [1, 1, T, T] mask with 0
    on/below the diagonal and torch.finfo(dtype).min above it (HF uses finfo.min,
    not -inf; after softmax both give exactly 0)."""
    min_dtype = torch.finfo(dtype).min
    upper = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)
    return (upper.to(dtype) * min_dtype)[None, None, :, :]


def sliding_window_causal_mask(seq_len, sliding_window, dtype, device=None):
    """masking_utils.eager_mask with sliding_window_causal_mask_function(sliding_window):

        causal_mask_function:   kv_idx <= q_idx
        sliding_window_overlay: kv_idx > q_idx - sliding_window

    so query i sees keys i - sliding_window + 1 .. i (itself and the sliding_window - 1
    before it; sliding_window >= T is plain causal). Additive [1, 1, T, T] mask: 0 where
    visible, torch.finfo(dtype).min elsewhere."""
    q_idx = torch.arange(seq_len, device=device)[:, None]
    kv_idx = torch.arange(seq_len, device=device)[None, :]
    visible = (kv_idx <= q_idx) & (kv_idx > q_idx - sliding_window)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(visible, zero, torch.finfo(dtype).min)[None, None, :, :]


def packed_sequence_indices(position_ids):
    """masking_utils.find_packed_sequence_indices: [B, T] sequence index of each token
    (cumsum of position_ids[t] - position_ids[t-1] != 1), or None when every row is one
    sequence."""
    first = position_ids[:, :1] - 1
    diff = torch.diff(position_ids, prepend=first, dim=-1)
    segments = (diff != 1).cumsum(-1)
    return None if bool((segments[:, -1] == 0).all()) else segments


def packed_mask(mask, segments):
    """An additive [1, 1, T, T] mask and'ed with packed_sequence_mask_function: query i sees
    key j only when both are in the same sequence. Returns [B, 1, T, T]. (Within one
    sequence, positions and indices differ by a constant, so masking_utils' remapping of
    q_idx / kv_idx to positions leaves the causal and window conditions unchanged.)"""
    same = (segments[:, :, None] == segments[:, None, :])[:, None, :, :]
    return torch.where(same, mask, torch.finfo(mask.dtype).min)


def attention(params, prefix, cfg, hidden_states, cos, sin, attn_mask):
    """LlamaAttention.forward + eager_attention_forward, no cache, no dropout (eval / p=0).
    Biases (params '<prefix>{q,k,v,o}_proj.bias') are added where the parameter exists."""
    bsz, q_len, _ = hidden_states.shape
    nH, nKV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    query_states = F.linear(hidden_states, params[prefix + "q_proj.weight"], params.get(prefix + "q_proj.bias"))
    key_states = F.linear(hidden_states, params[prefix + "k_proj.weight"], params.get(prefix + "k_proj.bias"))
    value_states = F.linear(hidden_states, params[prefix + "v_proj.weight"], params.get(prefix + "v_proj.bias"))

    # Head h of q occupies output features [h*D, (h+1)*D) of q_proj.
    query_states = query_states.view(bsz, q_len, nH, D)
    key_states = key_states.view(bsz, q_len, nKV, D)
    if cfg.qk_norm:  # Qwen3Attention: self.q_norm(self.q_proj(x).view(hidden_shape)), same for k, before RoPE
        query_states = rms_norm(query_states, params[prefix + "q_norm.weight"], cfg.rms_norm_eps)
        key_states = rms_norm(key_states, params[prefix + "k_norm.weight"], cfg.rms_norm_eps)
    query_states = query_states.transpose(1, 2)
    key_states = key_states.transpose(1, 2)
    value_states = value_states.view(bsz, q_len, nKV, D).transpose(1, 2)

    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

    key_states = repeat_kv(key_states, cfg.num_key_value_groups)
    value_states = repeat_kv(value_states, cfg.num_key_value_groups)

    # attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling, scaling = head_dim**-0.5
    # (a multiply; transformers 4.38-4.40 divided by sqrt(head_dim): bitwise the same for D = 16)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * cfg.attn_scaling
    attn_weights = attn_weights + attn_mask
    # upcast attention to fp32
    attn_weights = F.softmax(
        attn_weights, dim=-1, dtype=_upcast_dtype(query_states.dtype)
    ).to(query_states.dtype)
    attn_output = torch.matmul(attn_weights, value_states)  # [B, nH, T, D]

    attn_output = attn_output.transpose(1, 2).contiguous()
    attn_output = attn_output.reshape(bsz, q_len, nH * D)
    return F.linear(attn_output, params[prefix + "o_proj.weight"], params.get(prefix + "o_proj.bias"))


def mlp(params, prefix, hidden_states):
    """LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act = SiLU
    (biases where the parameters exist: llama mlp_bias)."""
    gate = F.linear(hidden_states, params[prefix + "gate_proj.weight"], params.get(prefix + "gate_proj.bias"))
    up = F.linear(hidden_states, params[prefix + "up_proj.weight"], params.get(prefix + "up_proj.bias"))
    return F.linear(F.silu(gate) * up, params[prefix + "down_proj.weight"], params.get(prefix + "down_proj.bias"))


def moe_block(params, prefix, cfg, hidden_states, router_logits_out=None):
    """MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock.forward (eval: no jitter), with transformers'
    own per-expert loop (MixtralExperts.forward), operation by operation:

        router_logits = F.linear(x, gate.weight)                       # [N, E]
        router_probs = softmax(router_logits.float(), dim=-1)
        top_value, top_index = topk(router_probs, top_k)
        top_value /= top_value.sum(-1, keepdim=True)                   # mixtral; qwen2_moe iff norm_topk_prob
        (qwen2_moe: top_value = top_value.to(router_logits.dtype))
        for each expert e hit: top_k_pos, token_idx = where(one_hot(top_index)[e] transposed)
            gate, up = F.linear(x[token_idx], gate_up_proj[e]).chunk(2, -1)
            y = F.linear(silu(gate) * up, down_proj[e]) * top_value[token_idx, top_k_pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        qwen2_moe: out = out + sigmoid(F.linear(x, shared_expert_gate.weight)) * shared_expert(x)
    """
    B, T, H = hidden_states.shape
    x = hidden_states.reshape(-1, H)
    logits = F.linear(x, params[prefix + "gate.weight"])
    if router_logits_out is not None:
        router_logits_out.append(logits)
    probs = F.softmax(logits.to(_upcast_dtype(logits.dtype)), dim=-1)
    top_value, top_index = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    if cfg.model_type in ("qwen2_moe", "qwen3_moe"):
        top_value = top_value.to(logits.dtype)
    gate_up, down = params[prefix + "experts.gate_up_proj"], params[prefix + "experts.down_proj"]
    out = torch.zeros_like(x)
    expert_mask = F.one_hot(top_index, num_classes=cfg.num_experts).permute(2, 1, 0)  # [E, k, N]
    for e in range(cfg.num_experts):
        top_k_pos, token_idx = torch.where(expert_mask[e])
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(x[token_idx], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[e]) * top_value[token_idx, top_k_pos, None]
        out = out.index_add(0, token_idx, y.to(out.dtype))
    if cfg.model_type == "qwen2_moe":
        shared = mlp(params, prefix + "shared_expert.", x)
        out = out + torch.sigmoid(F.linear(x, params[prefix + "shared_expert_gate.weight"])) * shared
    return out.reshape(B, T, H)


def load_balancing_loss(router_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func without an attention mask (models/mixtral, same in
    qwen2_moe): over every sparse layer's router logits [N, E] of one forward,

        routing = softmax(layer_logits, -1)            (in the logits' dtype)
        selected = topk(routing, top_k).indices
        tokens_per_expert_sum += histc(selected, bins=E, min=0, max=E)   (float32 counts)
        router_prob_sum += routing.float().sum(0);  total_rows += N
        loss = E * sum(tokens_per_expert_sum / total_rows * router_prob_sum / total_rows)

    (float64 in float64 mode). The counts carry no gradient."""
    acc = _upcast_dtype(router_logits[0].dtype)
    tokens = torch.zeros(num_experts, dtype=acc)
    probs = torch.zeros(num_experts, dtype=acc)
    rows = 0.0
    for logits in router_logits:
        routing = F.softmax(logits, dim=-1)
        _, selected = torch.topk(routing, top_k, dim=-1)
        tokens = tokens + torch.histc(selected.reshape(-1).to(acc), bins=num_experts, min=0, max=num_experts)
        probs = probs + routing.to(acc).sum(dim=0)
        rows = rows + routing.shape[0]
    return torch.sum((tokens / rows) * (probs / rows).unsqueeze(0)) * num_experts


def decoder_layer(params, i, cfg, hidden_states, cos, sin, attn_mask, router_logits_out=None):
    """LlamaDecoderLayer.forward: pre-norm residual blocks (the MLP a sparse MoE block on a
    sparse layer of mixtral / qwen2_moe)."""
    p = f"model.layers.{i}."
    residual = hidden_states
    hidden_states = rms_norm(hidden_states, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    hidden_states = attention(params, p + "self_attn.", cfg, hidden_states, cos, sin, attn_mask)
    hidden_states = residual + hidden_states

    residual = hidden_states
    hidden_states = rms_norm(
        hidden_states, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps
    )
    if cfg.sparse_layers[i]:
        hidden_states = moe_block(params, p + "mlp.", cfg, hidden_states, router_logits_out)
    else:
        hidden_states = mlp(params, p + "mlp.", hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states


def lm_head_weight(params, cfg):
    if cfg.tie_word_embeddings:
        if "lm_head.weight" in params:
            raise ValueError("tied config but an lm_head.weight was given")
        return params["model.embed_tokens.weight"]
    return params["lm_head.weight"]


def check_param_names(params, cfg):
    """The parameter dict must hold exactly param_shapes(cfg)'s names (biases included)."""
    expected = param_shapes(cfg)
    missing = [k for k in expected if k not in params]
    if missing:
        raise KeyError(f"parameters missing for this config: {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    unexpected = [k for k in params if k not in expected]
    if unexpected:
        raise ValueError(f"parameters this config does not have: {unexpected[:4]}")


# --------------------------------------------------------------------------- #
# Whole model
# --------------------------------------------------------------------------- #
def model_forward(params, cfg, input_ids, position_ids=None, router_logits_out=None):
    """LlamaModel / MistralModel / Qwen2Model .forward -> final hidden states [B, T, H]
    (after model.norm).

    Masks: index-based (query i, key j). Custom position_ids change RoPE, and, as
    masking_utils does when no attention_mask is given, a row whose position_ids restart
    (find_packed_sequence_indices: a new sequence wherever position[t] - position[t-1] != 1)
    holds packed sequences: packed_sequence_mask_function and'ed with the causal (or
    sliding-window) mask, so no token sees another sequence's (see packed_mask)."""
    check_param_names(params, cfg)
    B, T = input_ids.shape
    embed = params["model.embed_tokens.weight"]
    # nn.Embedding(vocab, hidden, padding_idx=config.pad_token_id): the forward is
    # a plain lookup; padding_idx only zeroes the gradient of that row.
    hidden_states = F.embedding(input_ids, embed, padding_idx=cfg.pad_token_id)
    if position_ids is None:
        # position_ids = torch.arange(T).unsqueeze(0) (no cache)
        position_ids = torch.arange(T, device=input_ids.device).unsqueeze(0).expand(B, T)

    dtype = hidden_states.dtype
    inv_freq, attention_scaling = rope_for_forward(cfg, position_ids, _upcast_dtype(dtype))
    cos, sin = rotary_cos_sin(inv_freq, position_ids, dtype, attention_scaling)

    segments = packed_sequence_indices(position_ids)
    masks = {}  # sliding window (None = full causal) -> mask
    for i in range(cfg.num_hidden_layers):
        window = cfg.layer_sliding_window(i)
        if window not in masks:
            masks[window] = (
                causal_mask(T, dtype, input_ids.device)
                if window is None
                else sliding_window_causal_mask(T, window, dtype, input_ids.device)
            )
            if segments is not None:
                masks[window] = packed_mask(masks[window], segments)
        hidden_states = decoder_layer(params, i, cfg, hidden_states, cos, sin, masks[window], router_logits_out)
    return rms_norm(hidden_states, params["model.norm.weight"], cfg.rms_norm_eps)


def forward(params, cfg, input_ids, position_ids=None):
    """XForCausalLM.forward -> logits [B, T, V], upcast like HF's loss does (`logits.float()`)."""
    hidden_states = model_forward(params, cfg, input_ids, position_ids)
    logits = F.linear(hidden_states, lm_head_weight(params, cfg))
    return logits.to(_upcast_dtype(logits.dtype))


def forward_with_aux(params, cfg, input_ids, position_ids=None):
    """(logits, aux) where aux is load_balancing_loss over the sparse layers' router logits when
    cfg.output_router_logits (XForCausalLM.forward), else None. The training loss transformers
    computes is then loss_fn(logits, targets) + cfg.router_aux_loss_coef * aux."""
    router_logits = [] if cfg.output_router_logits else None
    hidden_states = model_forward(params, cfg, input_ids, position_ids, router_logits)
    logits = F.linear(hidden_states, lm_head_weight(params, cfg))
    logits = logits.to(_upcast_dtype(logits.dtype))
    aux = load_balancing_loss(router_logits, cfg.num_experts, cfg.num_experts_per_tok) if router_logits else None
    return logits, aux


def loss_fn(logits, targets):
    """shardlm's convention: targets are already shifted (targets[b, t] is the
    token that should follow inputs[b, t]); mean cross-entropy over all B*T.

        F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))

    (F.cross_entropy's default ignore_index=-100 applies: such targets are
    excluded from both the sum and the count.)
    """
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V).to(_upcast_dtype(logits.dtype)), targets.reshape(-1))


def hf_labels_loss(logits, labels):
    """HF's own `labels=` loss, for reference: shift inside the model.

        shift_logits = logits[..., :-1, :]; shift_labels = labels[..., 1:]
        CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))

    loss_fn(forward(x[:, :-1]), x[:, 1:]) == hf_labels_loss(forward(x), x)
    except for the last position's logits, which HF computes but does not score.
    """
    V = logits.shape[-1]
    shift_logits = logits[..., :-1, :].contiguous().view(-1, V)
    shift_labels = labels[..., 1:].contiguous().view(-1)
    return F.cross_entropy(shift_logits, shift_labels)
