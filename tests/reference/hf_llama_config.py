"""The config side of hf_llama.py, the plain-torch transcription of transformers' Llama-family
causal LMs: what a config.json means to transformers 5.23 (configuration_*.py,
PreTrainedConfig, standardize_rope_params), read into `LlamaConfig`, and the parameters that
config gives a model (`param_shapes`, in HF's named_parameters() order). No torch here.

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
  With output_router_logits, hf_llama.py's `forward_with_aux` also returns transformers'
  load_balancing_loss_func of the sparse layers' router logits (`load_balancing_loss`),
  which XForCausalLM adds to the loss times router_aux_loss_coef.
Each family's defaults for absent keys are transformers' (FAMILY_DEFAULTS below).
"""

import copy
import json
from collections import OrderedDict


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
