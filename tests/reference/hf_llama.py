"""Plain-torch transcription of Hugging Face transformers' LlamaForCausalLM.

This is the reference the C++ model (shardlm) is tested against. It follows
transformers' `models/llama/modeling_llama.py` (v4.38-4.40 era, eager
attention path, no KV cache, no rope_scaling, pretraining_tp == 1) operation by
operation, including where HF changes dtypes, so that in float32 it produces the
same numbers HF produces (up to float rounding-order differences).

Nothing is imported from transformers (the goldens must not depend on its
version); tests/reference/check_transformers.py runs transformers' own model
(5.x) on the same weights and checks that both agree. The model is a set of
functions over a dict of parameters keyed by HF's exact parameter names:

    model.embed_tokens.weight                         [V, H]
    model.layers.{i}.self_attn.q_proj.weight          [nH*D, H]
    model.layers.{i}.self_attn.k_proj.weight          [nKV*D, H]
    model.layers.{i}.self_attn.v_proj.weight          [nKV*D, H]
    model.layers.{i}.self_attn.o_proj.weight          [H, nH*D]
    model.layers.{i}.mlp.gate_proj.weight             [I, H]
    model.layers.{i}.mlp.up_proj.weight               [I, H]
    model.layers.{i}.mlp.down_proj.weight             [H, I]
    model.layers.{i}.input_layernorm.weight           [H]
    model.layers.{i}.post_attention_layernorm.weight  [H]
    model.norm.weight                                 [H]
    lm_head.weight                                    [V, H]  (absent when tied)

Linear weights are [out_features, in_features] (nn.Linear), y = x @ W^T, no biases.
(That is also the order in which HF's `named_parameters()` yields them.)

Float64 mode: if the parameters are float64, every place where HF forces
float32 (RMSNorm upcast, RoPE cos/sin, softmax, logits.float()) uses float64
instead, so the same code gives a high-precision reference for the float32
path. For float32/bf16/fp16 parameters the behaviour is exactly HF's.
"""

import json
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------- #
# Config
# --------------------------------------------------------------------------- #
class LlamaConfig:
    """The subset of HF's LlamaConfig that the forward pass depends on."""

    def __init__(
        self,
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=None,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        pad_token_id=None,
        attention_bias=False,
        rope_scaling=None,
        pretraining_tp=1,
        **unused,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        # HF: "if num_key_value_heads is None: num_key_value_heads = num_attention_heads"
        self.num_key_value_heads = (
            num_attention_heads if num_key_value_heads is None else num_key_value_heads
        )
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.tie_word_embeddings = tie_word_embeddings
        self.hidden_act = hidden_act
        self.pad_token_id = pad_token_id
        if attention_bias:
            raise NotImplementedError("attention_bias=True is not transcribed")
        if rope_scaling is not None:
            raise NotImplementedError("rope_scaling is not transcribed")
        if pretraining_tp != 1:
            raise NotImplementedError("pretraining_tp > 1 is not transcribed")
        if hidden_act != "silu":
            raise NotImplementedError("only hidden_act='silu' is transcribed")
        self.head_dim = hidden_size // num_attention_heads
        if self.head_dim * num_attention_heads != hidden_size:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.num_key_value_groups = num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, d):
        return cls(**d)

    @classmethod
    def from_json_file(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))


def param_shapes(cfg):
    """OrderedDict name -> shape, in HF's named_parameters() order."""
    H, I, V, D = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    nH, nKV = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = OrderedDict()
    shapes["model.embed_tokens.weight"] = (V, H)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (nH * D, H)
        shapes[p + "self_attn.k_proj.weight"] = (nKV * D, H)
        shapes[p + "self_attn.v_proj.weight"] = (nKV * D, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, nH * D)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
    shapes["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


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
    """LlamaRMSNorm.forward.

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


def rotary_inv_freq(head_dim, rope_theta, dtype=torch.float32):
    """LlamaRotaryEmbedding.__init__:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    (computed in float32 in HF; `dtype` only differs for the float64 reference)
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (rope_theta ** exponent)


def rotary_cos_sin(inv_freq, position_ids, out_dtype):
    """LlamaRotaryEmbedding.forward (rope_scaling=None).

        inv_freq_expanded = inv_freq[None, :, None].float().expand(B, -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)   # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                                # [B, T, D]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    The angle for position p and frequency j is the float32 product p * inv_freq[j]
    (a matmul with inner dimension 1 == one rounded multiply). Both halves of the
    head dimension share the same frequencies ("cat", not "interleave").
    """
    B = position_ids.shape[0]
    acc = inv_freq.dtype
    inv_freq_expanded = inv_freq[None, :, None].to(acc).expand(B, -1, 1)
    position_ids_expanded = position_ids[:, None, :].to(acc)
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(out_dtype), emb.sin().to(out_dtype)


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
    """LlamaModel._update_causal_mask without padding: an additive [1, 1, T, T]
    mask with 0 on/below the diagonal and torch.finfo(dtype).min above it
    (HF uses finfo.min, not -inf; after softmax both give exactly 0)."""
    min_dtype = torch.finfo(dtype).min
    upper = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)
    return (upper.to(dtype) * min_dtype)[None, None, :, :]


def attention(params, prefix, cfg, hidden_states, cos, sin, attn_mask):
    """LlamaAttention.forward (eager), no cache, no dropout (eval / p=0)."""
    bsz, q_len, _ = hidden_states.shape
    nH, nKV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    query_states = F.linear(hidden_states, params[prefix + "q_proj.weight"])
    key_states = F.linear(hidden_states, params[prefix + "k_proj.weight"])
    value_states = F.linear(hidden_states, params[prefix + "v_proj.weight"])

    # Head h of q occupies output features [h*D, (h+1)*D) of q_proj.
    query_states = query_states.view(bsz, q_len, nH, D).transpose(1, 2)
    key_states = key_states.view(bsz, q_len, nKV, D).transpose(1, 2)
    value_states = value_states.view(bsz, q_len, nKV, D).transpose(1, 2)

    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

    key_states = repeat_kv(key_states, cfg.num_key_value_groups)
    value_states = repeat_kv(value_states, cfg.num_key_value_groups)

    # transformers 5 multiplies by D**-0.5 instead: bitwise the same when D is a power of 4 (D=16 here)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(D)
    attn_weights = attn_weights + attn_mask
    # upcast attention to fp32
    attn_weights = F.softmax(
        attn_weights, dim=-1, dtype=_upcast_dtype(query_states.dtype)
    ).to(query_states.dtype)
    attn_output = torch.matmul(attn_weights, value_states)  # [B, nH, T, D]

    attn_output = attn_output.transpose(1, 2).contiguous()
    attn_output = attn_output.reshape(bsz, q_len, nH * D)
    return F.linear(attn_output, params[prefix + "o_proj.weight"])


def mlp(params, prefix, hidden_states):
    """LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act = SiLU."""
    gate = F.linear(hidden_states, params[prefix + "gate_proj.weight"])
    up = F.linear(hidden_states, params[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, params[prefix + "down_proj.weight"])


def decoder_layer(params, i, cfg, hidden_states, cos, sin, attn_mask):
    """LlamaDecoderLayer.forward: pre-norm residual blocks."""
    p = f"model.layers.{i}."
    residual = hidden_states
    hidden_states = rms_norm(hidden_states, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
    hidden_states = attention(params, p + "self_attn.", cfg, hidden_states, cos, sin, attn_mask)
    hidden_states = residual + hidden_states

    residual = hidden_states
    hidden_states = rms_norm(
        hidden_states, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps
    )
    hidden_states = mlp(params, p + "mlp.", hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states


def lm_head_weight(params, cfg):
    if cfg.tie_word_embeddings:
        if "lm_head.weight" in params:
            raise ValueError("tied config but an lm_head.weight was given")
        return params["model.embed_tokens.weight"]
    return params["lm_head.weight"]


# --------------------------------------------------------------------------- #
# Whole model
# --------------------------------------------------------------------------- #
def model_forward(params, cfg, input_ids, position_ids=None):
    """LlamaModel.forward -> final hidden states [B, T, H] (after model.norm)."""
    B, T = input_ids.shape
    embed = params["model.embed_tokens.weight"]
    # nn.Embedding(vocab, hidden, padding_idx=config.pad_token_id): the forward is
    # a plain lookup; padding_idx only zeroes the gradient of that row.
    hidden_states = F.embedding(input_ids, embed, padding_idx=cfg.pad_token_id)
    if position_ids is None:
        # cache_position = arange(T); position_ids = cache_position.unsqueeze(0)
        position_ids = torch.arange(T, device=input_ids.device).unsqueeze(0).expand(B, T)

    dtype = hidden_states.dtype
    inv_freq = rotary_inv_freq(cfg.head_dim, cfg.rope_theta, _upcast_dtype(dtype))
    cos, sin = rotary_cos_sin(inv_freq, position_ids, dtype)
    attn_mask = causal_mask(T, dtype, input_ids.device)

    for i in range(cfg.num_hidden_layers):
        hidden_states = decoder_layer(params, i, cfg, hidden_states, cos, sin, attn_mask)
    return rms_norm(hidden_states, params["model.norm.weight"], cfg.rms_norm_eps)


def forward(params, cfg, input_ids, position_ids=None):
    """LlamaForCausalLM.forward -> logits [B, T, V], upcast like HF (`logits.float()`)."""
    hidden_states = model_forward(params, cfg, input_ids, position_ids)
    logits = F.linear(hidden_states, lm_head_weight(params, cfg))
    return logits.to(_upcast_dtype(logits.dtype))


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
