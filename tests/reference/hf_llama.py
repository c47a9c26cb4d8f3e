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

Families (config.json `model_type`; absent means llama):
  llama    LlamaForCausalLM: attention_bias (q, k, v, o), mlp_bias (gate, up, down);
           every layer full causal attention (a `sliding_window` or `layer_types`
           key is ignored, as LlamaModel ignores it).
  mistral  MistralForCausalLM: no biases; when `sliding_window` is not null (default
           4096!) EVERY layer uses the sliding-window mask; `layer_types` is ignored.
  qwen2    Qwen2ForCausalLM: q/k/v biases always, no o_proj / MLP biases;
           sliding_window only counts when use_sliding_window is true; per-layer
           `layer_types` ("full_attention" / "sliding_attention"), derived when absent
           as Qwen2Config.__post_init__ does (layer i slides iff sliding_window is set
           and i >= max_window_layers).
  mixtral  MixtralForCausalLM: Mistral's attention (window on every layer when set,
           default null) with every MLP a sparse MoE block (`moe_block`): router
           `mlp.gate.weight` [E, H], softmax in float32, top-k, top-k weights
           renormalised; experts SwiGLU of intermediate_size, fused as transformers 5
           keeps them: `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
           `mlp.experts.down_proj` [E, H, I].
  qwen2_moe Qwen2MoeForCausalLM: q/k/v biases (qkv_bias, default true); layer i sparse
           iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a
           dense MLP of intermediate_size; experts of moe_intermediate_size; top-k
           renormalised only with norm_topk_prob; plus a shared expert
           (`mlp.shared_expert.{gate,up,down}_proj.weight`, width
           shared_expert_intermediate_size) times sigmoid(`mlp.shared_expert_gate.weight` x).
           No sliding windows (use_sliding_window false only).
  qwen3    Qwen3ForCausalLM: attention_bias (q, k, v, o); q_norm / k_norm (`self_attn.q_norm.weight`,
           `self_attn.k_norm.weight`, [head_dim]): RMSNorm of each head's q and k over head_dim,
           before RoPE; head_dim default 128. No sliding windows (use_sliding_window false only).
  qwen3_moe Qwen3MoeForCausalLM: qwen3's attention (head_dim default hidden / heads), sparse layers
           as qwen2_moe's without the shared expert; its experts come before the router in
           named_parameters().
  With output_router_logits, `forward_with_aux` also returns transformers'
  load_balancing_loss_func of the sparse layers' router logits (`load_balancing_loss`),
  which XForCausalLM adds to the loss times router_aux_loss_coef.
Each family's defaults for absent keys are transformers' (FAMILY_DEFAULTS below).

RoPE (`rope_parameters` in 5.x configs; `rope_theta` + `rope_scaling` in 4.x ones,
read as transformers' `convert_rope_params_to_dict` + `standardize_rope_params`
do, see `standardize_rope_parameters`): rope_type default, linear, dynamic, yarn,
longrope, llama3, each computing inverse frequencies and an attention scaling
(cos and sin are multiplied by it) exactly as transformers' rope init functions
do, plus the per-forward re-choice of `dynamic_rope_update` (dynamic NTK:
recomputed for seq_len = max(position_ids) + 1 when that exceeds
max_position_embeddings; longrope: long_factor iff seq_len >
original_max_position_embeddings, else short_factor). What is NOT modelled: the
state transformers' DynamicNTK rotary module keeps across forwards (after a
forward of length T1 > max_position_embeddings it keeps T1's frequencies for every
later forward of length T2 with max_position_embeddings <= T2 <= T1, and only
resets when T2 < max_position_embeddings); hf_llama is always a fresh model's
forward, i.e. frequencies for T2 itself.

Float64 mode: if the parameters are float64, every place where HF forces
float32 (RMSNorm upcast, RoPE inv_freq / cos / sin and every RoPE-parameter
tensor computation, softmax, logits.float()) uses float64 instead, so the same
code gives a high-precision reference for the float32 path. For
float32/bf16/fp16 parameters the behaviour is exactly HF's.
"""

import copy
import json
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------- #
# Config
# --------------------------------------------------------------------------- #
# transformers' defaults (configuration_{llama,mistral,qwen2}.py, 5.23) for the keys
# the forward pass depends on, used when config.json lacks them.
FAMILY_DEFAULTS = {
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, attention_bias=False, mlp_bias=False, head_dim=None,
    ),
    "mistral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
        max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, head_dim=None, sliding_window=4096,
    ),
    "qwen2": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, head_dim=None, use_sliding_window=False, sliding_window=4096,
        max_window_layers=28, layer_types=None,
    ),
    "mixtral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
        max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, tie_word_embeddings=False,
        pad_token_id=None, head_dim=None, sliding_window=None, rope_theta=1e6,
        num_local_experts=8, num_experts_per_tok=2, output_router_logits=False, router_aux_loss_coef=0.001,
        router_jitter_noise=0.0,
    ),
    "qwen3": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, head_dim=128, use_sliding_window=False, attention_bias=False,
    ),
    "qwen3_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=4, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, head_dim=None, use_sliding_window=False, attention_bias=False,
        decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128,
        norm_topk_prob=False, output_router_logits=False, router_aux_loss_coef=0.001, mlp_only_layers=None,
    ),
    "qwen2_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=None, head_dim=None, use_sliding_window=False, qkv_bias=True,
        decoder_sparse_step=1, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        num_experts_per_tok=4, num_experts=60, norm_topk_prob=False, output_router_logits=False,
        router_aux_loss_coef=0.001, mlp_only_layers=None,
    ),
}
DEFAULT_ROPE_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta (all three families)
LAYER_TYPES = ("full_attention", "sliding_attention")

# keys each rope_type requires (transformers' _validate_*_rope_parameters raise KeyError without them)
_ROPE_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}


def standardize_rope_parameters(d):
    """The `rope_parameters` dict transformers 5.x ends up with for config.json dict `d`.

    PreTrainedConfig.__post_init__ -> convert_rope_params_to_dict, then
    standardize_rope_params (run again by every rope init function at model build):

      rope_parameters = rope_scaling or rope_parameters or {}   # a non-empty 4.x `rope_scaling`
                                                                # REPLACES rope_parameters entirely
      rope_parameters.setdefault("rope_theta", top-level rope_theta, else 10000.0)
      rope_parameters.setdefault("partial_rotary_factor", top-level one)  (if present)
      rope_parameters.setdefault("rope_type", rope_parameters.get("type", "default"))   # 4.x alias
      for llama3 / yarn / longrope: original_max_position_embeddings =
          the TOP-LEVEL original_max_position_embeddings key if config.json has one
          (overrides the dict's value: transformers' Phi3 exception, applied when the
          model is built), else setdefault(max_position_embeddings)

    So rope_parameters' own rope_theta wins over a top-level rope_theta, and a
    top-level rope_theta is used with a 4.x rope_scaling dict.
    """
    rp = d.get("rope_scaling") or d.get("rope_parameters")
    rp = copy.deepcopy(dict(rp)) if rp else {}
    layer_types = d.get("layer_types") or ()
    if any(k in layer_types for k in rp):
        raise NotImplementedError("rope_parameters nested per layer type are not transcribed")
    rp.setdefault("rope_theta", d.get("rope_theta", DEFAULT_ROPE_THETA))
    if d.get("partial_rotary_factor") is not None:
        rp.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
    rp.setdefault("rope_type", rp.get("type", "default"))
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in d:
            rp["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        else:
            rp.setdefault("original_max_position_embeddings", d["max_position_embeddings"])
    return rp


_ABSENT = object()  # "key not in config.json" (None is a JSON null)


class LlamaConfig:
    """The subset of a transformers Llama / Mistral / Qwen2 config that the forward
    pass depends on, read from a config.json dict with each family's defaults.

    Attributes: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, head_dim, num_key_value_groups,
    max_position_embeddings, rms_norm_eps, tie_word_embeddings, pad_token_id,
    hidden_act, model_type, rope_parameters (standardized dict), rope_type,
    rope_theta, sliding_window (int or None), layer_types (one of LAYER_TYPES per
    layer), qkv_bias, o_bias, mlp_bias, attn_scaling (= head_dim ** -0.5).
    """

    def __init__(
        self,
        vocab_size=_ABSENT,
        hidden_size=_ABSENT,
        intermediate_size=_ABSENT,
        num_hidden_layers=_ABSENT,
        num_attention_heads=_ABSENT,
        num_key_value_heads=_ABSENT,
        max_position_embeddings=_ABSENT,
        rms_norm_eps=_ABSENT,
        rope_theta=_ABSENT,
        tie_word_embeddings=_ABSENT,
        hidden_act=_ABSENT,
        pad_token_id=_ABSENT,
        attention_bias=_ABSENT,
        rope_scaling=_ABSENT,
        pretraining_tp=_ABSENT,
        model_type=_ABSENT,
        head_dim=_ABSENT,
        mlp_bias=_ABSENT,
        rope_parameters=_ABSENT,
        partial_rotary_factor=_ABSENT,
        original_max_position_embeddings=_ABSENT,
        sliding_window=_ABSENT,
        use_sliding_window=_ABSENT,
        max_window_layers=_ABSENT,
        layer_types=_ABSENT,
        num_local_experts=_ABSENT,
        num_experts=_ABSENT,
        num_experts_per_tok=_ABSENT,
        norm_topk_prob=_ABSENT,
        moe_intermediate_size=_ABSENT,
        shared_expert_intermediate_size=_ABSENT,
        decoder_sparse_step=_ABSENT,
        mlp_only_layers=_ABSENT,
        output_router_logits=_ABSENT,
        router_aux_loss_coef=_ABSENT,
        router_jitter_noise=_ABSENT,
        qkv_bias=_ABSENT,
        **unused,
    ):
        # Every config.json key the model reads is a named parameter (callers filter config.json
        # by this signature); a parameter not given counts as absent from config.json, so the
        # family's default applies (an explicit None is an explicit null).
        d = {k: v for k, v in locals().items() if k not in ("self", "unused") and v is not _ABSENT}
        d.update(unused)
        model_type = d.get("model_type") or "llama"
        if model_type not in FAMILY_DEFAULTS:
            raise NotImplementedError(f"model_type {model_type!r} is not transcribed")
        self.model_type = model_type
        d = dict(FAMILY_DEFAULTS[model_type], **d)
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        # HF: "if num_key_value_heads is None: num_key_value_heads = num_attention_heads"
        # (the DEFAULT is None -> heads for llama, but 8 for mistral and 32 for qwen2)
        self.num_key_value_heads = (
            d["num_attention_heads"] if d.get("num_key_value_heads") is None else d["num_key_value_heads"]
        )
        self.max_position_embeddings = d["max_position_embeddings"]
        self.rms_norm_eps = d["rms_norm_eps"]
        self.tie_word_embeddings = bool(d["tie_word_embeddings"])
        self.hidden_act = d["hidden_act"]
        self.pad_token_id = d.get("pad_token_id")
        if self.hidden_act != "silu":
            raise NotImplementedError("only hidden_act='silu' is transcribed")
        # (pretraining_tp is ignored: transformers 5.x's Llama no longer splits the matmuls)

        # head_dim: the key when present and not null (qwen2 has no such field, but a
        # config.json key becomes an attribute that its attention and RoPE read)
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        if model_type == "llama" and self.hidden_size % self.num_attention_heads != 0:
            # LlamaConfig.validate_architecture, even when head_dim is given
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.num_key_value_groups = self.num_attention_heads // self.num_key_value_heads
        # LlamaAttention: self.scaling = self.head_dim**-0.5 (a multiply, after q @ k^T)
        self.attn_scaling = self.head_dim ** -0.5

        # biases
        self.qk_norm = model_type in ("qwen3", "qwen3_moe")
        if model_type == "llama":
            self.qkv_bias = self.o_bias = bool(d["attention_bias"])
            self.mlp_bias = bool(d["mlp_bias"])
        elif model_type in ("qwen3", "qwen3_moe"):
            self.qkv_bias = self.o_bias = bool(d["attention_bias"])
            self.mlp_bias = False
        elif model_type in ("mistral", "mixtral"):
            self.qkv_bias = self.o_bias = self.mlp_bias = False
        elif model_type == "qwen2_moe":
            self.qkv_bias, self.o_bias, self.mlp_bias = bool(d["qkv_bias"]), False, False
        else:  # qwen2
            self.qkv_bias, self.o_bias, self.mlp_bias = True, False, False

        # mixture of experts (num_experts 0: dense)
        self.num_experts = 0
        self.sparse_layers = [False] * d["num_hidden_layers"]
        if model_type == "mixtral":
            if d.get("router_jitter_noise"):
                raise NotImplementedError("router_jitter_noise > 0 is not transcribed")
            self.num_experts = d["num_local_experts"]
            self.expert_intermediate_size = d["intermediate_size"]
            self.norm_topk_prob = True
            self.shared_expert_intermediate_size = 0
            self.sparse_layers = [True] * d["num_hidden_layers"]
        elif model_type in ("qwen2_moe", "qwen3_moe"):
            # Qwen3MoeConfig.attribute_map: num_experts -> num_local_experts (the name 5.x writes)
            self.num_experts = d["num_local_experts"] if "num_local_experts" in d else d["num_experts"]
            self.expert_intermediate_size = d["moe_intermediate_size"]
            self.norm_topk_prob = bool(d["norm_topk_prob"])
            self.shared_expert_intermediate_size = d.get("shared_expert_intermediate_size", 0) \
                if model_type == "qwen2_moe" else 0
            mlp_only = d.get("mlp_only_layers") or []
            # Qwen2MoeDecoderLayer.__init__
            self.sparse_layers = [i not in mlp_only and self.num_experts > 0 and (i + 1) % d["decoder_sparse_step"] == 0
                                  for i in range(d["num_hidden_layers"])]
        if self.num_experts:
            self.num_experts_per_tok = d["num_experts_per_tok"]
            self.output_router_logits = bool(d["output_router_logits"])
            self.router_aux_loss_coef = d["router_aux_loss_coef"]
        else:
            self.output_router_logits = False

        # attention pattern per layer
        L = self.num_hidden_layers
        if model_type == "llama":
            self.sliding_window = None
            self.layer_types = ["full_attention"] * L
        elif model_type in ("mistral", "mixtral"):
            # MistralModel / MixtralModel: create_sliding_window_causal_mask for all layers iff sliding_window is not None
            self.sliding_window = d.get("sliding_window")
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            self.layer_types = [kind] * L
        elif model_type in ("qwen2_moe", "qwen3", "qwen3_moe"):
            if d.get("use_sliding_window"):
                raise NotImplementedError(f"{model_type} sliding windows are not transcribed")
            self.sliding_window = None
            self.layer_types = ["full_attention"] * L
        else:
            # Qwen2Config.__post_init__
            self.sliding_window = d["sliding_window"] if d.get("use_sliding_window") else None
            if d.get("layer_types") is None:
                self.layer_types = [
                    "sliding_attention"
                    if self.sliding_window is not None and i >= d["max_window_layers"]
                    else "full_attention"
                    for i in range(L)
                ]
            else:
                # remap_legacy_layer_types: "attention" -> "full_attention"
                self.layer_types = ["full_attention" if t == "attention" else t for t in d["layer_types"]]
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                # create_sliding_window_causal_mask raises the same
                raise ValueError("a sliding_attention layer but no sliding_window (use_sliding_window false?)")
        if len(self.layer_types) < L or any(t not in LAYER_TYPES for t in self.layer_types[:L]):
            raise NotImplementedError(f"layer_types {self.layer_types!r} not transcribed")
        if self.sliding_window is not None and int(self.sliding_window) < 1:
            raise ValueError("sliding_window must be >= 1")

        # RoPE
        self.rope_parameters = standardize_rope_parameters(d)
        self.rope_type = self.rope_parameters["rope_type"]
        self.rope_theta = self.rope_parameters["rope_theta"]
        if self.rope_type not in _ROPE_REQUIRED:
            raise NotImplementedError(f"rope_type {self.rope_type!r} is not transcribed")
        missing = [k for k in _ROPE_REQUIRED[self.rope_type] if k not in self.rope_parameters]
        if missing:
            raise KeyError(f"rope_parameters for rope_type {self.rope_type!r} lack {missing}")
        prf = self.rope_parameters.get("partial_rotary_factor", 1.0)
        if prf is not None and int(self.head_dim * prf) != self.head_dim:
            raise NotImplementedError("partial_rotary_factor < 1 is not transcribed (Llama-family attention "
                                      "rotates the whole head)")
        self.rope_dim = self.head_dim

    def layer_sliding_window(self, i):
        """The sliding window of layer i's attention mask, or None for full causal."""
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None

    @classmethod
    def from_dict(cls, d):
        return cls(**d)

    @classmethod
    def from_json_file(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))


def param_shapes(cfg):
    """OrderedDict name -> shape, in HF's named_parameters() order (bias right after its weight)."""
    H, I, V, D = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    nH, nKV = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = OrderedDict()
    shapes["model.embed_tokens.weight"] = (V, H)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, out_f, in_f, has_bias in (
            ("self_attn.q_proj", nH * D, H, cfg.qkv_bias),
            ("self_attn.k_proj", nKV * D, H, cfg.qkv_bias),
            ("self_attn.v_proj", nKV * D, H, cfg.qkv_bias),
            ("self_attn.o_proj", H, nH * D, cfg.o_bias),
        ):
            shapes[p + name + ".weight"] = (out_f, in_f)
            if has_bias:
                shapes[p + name + ".bias"] = (out_f,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        if cfg.sparse_layers[i]:
            E, Ie, S = cfg.num_experts, cfg.expert_intermediate_size, cfg.shared_expert_intermediate_size
            if cfg.model_type != "qwen3_moe":
                shapes[p + "mlp.gate.weight"] = (E, H)
            shapes[p + "mlp.experts.gate_up_proj"] = (E, 2 * Ie, H)
            shapes[p + "mlp.experts.down_proj"] = (E, H, Ie)
            if cfg.model_type == "qwen3_moe":  # Qwen3MoeSparseMoeBlock registers experts, then gate
                shapes[p + "mlp.gate.weight"] = (E, H)
            if cfg.model_type == "qwen2_moe":
                shapes[p + "mlp.shared_expert.gate_proj.weight"] = (S, H)
                shapes[p + "mlp.shared_expert.up_proj.weight"] = (S, H)
                shapes[p + "mlp.shared_expert.down_proj.weight"] = (H, S)
                shapes[p + "mlp.shared_expert_gate.weight"] = (1, H)
        else:
            for name, out_f, in_f in (("mlp.gate_proj", I, H), ("mlp.up_proj", I, H), ("mlp.down_proj", H, I)):
                shapes[p + name + ".weight"] = (out_f, in_f)
                if cfg.mlp_bias:
                    shapes[p + name + ".bias"] = (out_f,)
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
# RoPE (modeling_rope_utils.py + LlamaRotaryEmbedding)
# --------------------------------------------------------------------------- #
def rotary_inv_freq(head_dim, rope_theta, dtype=torch.float32):
    """LlamaRotaryEmbedding.compute_default_rope_parameters:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    (computed in float32 in HF; `dtype` only differs for the float64 reference)
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (rope_theta ** exponent)


def _rope_exponents(dim, dtype):
    """torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim (in `dtype`)"""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim


def _yarn_get_mscale(scale, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_init(cfg, dtype=torch.float32, seq_len=None):
    """ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len) (or the default one):
    returns (inv_freq [D/2] in `dtype`, attention_scaling: Python float).

    Scalars (base, factor, attention factor, YaRN correction range, llama3
    wavelength bands) are Python doubles as in HF; tensors are float32 in HF and
    `dtype` here (float64 for the float64 reference). The expressions are HF's,
    operand for operand, so float32 results are bitwise HF's.
    """
    rp = cfg.rope_parameters
    rope_type = cfg.rope_type
    base = rp["rope_theta"]
    dim = cfg.rope_dim

    if rope_type == "default":
        return rotary_inv_freq(dim, base, dtype), 1.0

    if rope_type == "linear":
        # _compute_linear_scaling_rope_parameters: frequencies divided by factor
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        inv_freq /= rp["factor"]
        return inv_freq, 1.0

    if rope_type == "dynamic":
        # _compute_dynamic_ntk_parameters. seq_len None (model init): max_position_embeddings
        # (Python) -> base unchanged when factor * max / max - (factor - 1) == 1. In a forward
        # HF passes seq_len = torch.max(position_ids) + 1, an int64 TENSOR: then `base` becomes a
        # 0-dim float32 tensor (the default dtype) and the NTK base is computed in float32.
        factor = rp["factor"]
        max_pos = cfg.max_position_embeddings
        if seq_len is None:
            seq_len = max_pos
        elif isinstance(seq_len, torch.Tensor):
            seq_len = torch.maximum(seq_len, torch.tensor(max_pos, dtype=seq_len.dtype, device=seq_len.device))
        else:
            seq_len = max(seq_len, max_pos)
        base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        return inv_freq, 1.0

    if rope_type == "yarn":
        # _compute_yarn_parameters
        factor = rp["factor"]
        attention_factor = rp.get("attention_factor")
        mscale = rp.get("mscale")
        mscale_all_dim = rp.get("mscale_all_dim")
        omp = rp["original_max_position_embeddings"]
        if factor is None:
            factor = cfg.max_position_embeddings / omp
        if attention_factor is None:
            if mscale and mscale_all_dim:  # truthiness: 0 / None -> the default formula
                attention_factor = float(_yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = _yarn_get_mscale(factor)
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def find_correction_dim(num_rotations):
            return (dim * math.log(omp / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        truncate = rp.get("truncate", True)  # truthiness: an explicit null means "do not truncate"
        low = find_correction_dim(beta_fast)
        high = find_correction_dim(beta_slow)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # Prevent singularity
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)

        pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=dtype) / dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (factor * pos_freqs)
        inv_freq_extrapolation_factor = 1 - ramp
        inv_freq = (
            inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
            + inv_freq_extrapolation * inv_freq_extrapolation_factor
        )
        return inv_freq, attention_factor

    if rope_type == "longrope":
        # _compute_longrope_parameters
        long_factor = rp["long_factor"]
        short_factor = rp["short_factor"]
        factor = rp.get("factor")
        attention_factor = rp.get("attention_factor")
        omp = rp["original_max_position_embeddings"]
        if factor is None:
            factor = cfg.max_position_embeddings / omp
        if attention_factor is None:
            if factor <= 1.0:
                attention_factor = 1.0
            else:
                attention_factor = math.sqrt(1 + math.log(factor) / math.log(omp))
        if seq_len and seq_len > omp:
            ext_factors = torch.tensor(long_factor, dtype=dtype)
        else:
            ext_factors = torch.tensor(short_factor, dtype=dtype)
        inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim
        inv_freq = 1.0 / (ext_factors * base ** inv_freq_shape)
        return inv_freq, attention_factor

    if rope_type == "llama3":
        # _compute_llama3_parameters
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        factor = rp["factor"]
        low_freq_factor = rp["low_freq_factor"]
        high_freq_factor = rp["high_freq_factor"]
        old_context_len = rp["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # wavelen < high_freq_wavelen: do nothing; wavelen > low_freq_wavelen: divide by factor
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        # otherwise: interpolate between the two, using a smooth factor
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
        return inv_freq_llama, 1.0

    raise NotImplementedError(rope_type)


def llama3_bands(cfg, dtype=torch.float32):
    """For rope_type llama3: per frequency 'high' (kept), 'medium' (smoothed) or 'low'
    (divided by factor), with HF's comparisons (wavelen = 2*pi / inv_freq in `dtype`)."""
    rp = cfg.rope_parameters
    inv_freq = 1.0 / (rp["rope_theta"] ** _rope_exponents(cfg.rope_dim, dtype))
    wavelen = 2 * math.pi / inv_freq
    low = rp["original_max_position_embeddings"] / rp["low_freq_factor"]
    high = rp["original_max_position_embeddings"] / rp["high_freq_factor"]
    is_high, is_low = (wavelen < high).tolist(), (wavelen > low).tolist()
    return ["low" if lo else "high" if hi else "medium" for hi, lo in zip(is_high, is_low)]


def rope_for_forward(cfg, position_ids, dtype=torch.float32):
    """(inv_freq, attention_scaling) that transformers' rotary module uses in the forward of
    a freshly built model with these position_ids (`dynamic_rope_update`):

      seq_len = torch.max(position_ids) + 1
      dynamic:  seq_len > max_position_embeddings (= max_seq_len_cached of a fresh model)
                -> rope_init(seq_len=seq_len), seq_len an int64 tensor (float32 NTK base;
                a Python int in float64 mode so that it stays in double); else the init values
      longrope: long_factor frequencies iff seq_len > original_max_position_embeddings, else
                short_factor; attention_scaling is always the init one (it does not depend on
                seq_len)
      others:   the init values
    """
    rope_type = cfg.rope_type
    if rope_type == "dynamic":
        seq_len = torch.max(position_ids) + 1
        if seq_len > cfg.max_position_embeddings:
            return rope_init(cfg, dtype, seq_len=int(seq_len) if dtype == torch.float64 else seq_len)
        return rope_init(cfg, dtype)
    if rope_type == "longrope":
        seq_len = int(torch.max(position_ids)) + 1
        omp = cfg.rope_parameters["original_max_position_embeddings"]
        inv_freq, attention_scaling = rope_init(cfg, dtype)
        if seq_len > omp:
            inv_freq, _ = rope_init(cfg, dtype, seq_len=omp + 1)
        return inv_freq, attention_scaling
    return rope_init(cfg, dtype)


def rotary_cos_sin(inv_freq, position_ids, out_dtype, attention_scaling=1.0):
    """LlamaRotaryEmbedding.forward.

        freqs = position_ids[..., None].float() * self.inv_freq.float()   # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                           # [B, T, D]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)

    The angle for position p and frequency j is the float32 product p * inv_freq[j]
    (one rounded multiply). Both halves of the head dimension share the same
    frequencies ("cat", not "interleave"). The attention scaling (1.0 except for
    yarn and longrope) multiplies cos and sin in float32, before the cast.
    """
    acc = inv_freq.dtype
    freqs = position_ids[..., None].to(acc) * inv_freq.to(acc)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(out_dtype), sin.to(out_dtype)


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
