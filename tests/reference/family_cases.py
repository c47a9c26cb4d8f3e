"""The parity cases make_family_cases.py builds with the pinned transformers: each Llama-family
feature as a tiny config (`case`), with the perturbations of hf_llama.py that must move its result
(`moves`) or leave it alone (`same`), and the config.json dicts whose reading hf_llama must share with
transformers (CONFIG_READING). make_family_cases.py's docstring says what it writes and checks.

transformers (5.23) semantics these cases pin down (hf_llama.py transcribes each):
  - config: `rope_scaling or rope_parameters` -- a non-empty 4.x rope_scaling replaces
    rope_parameters entirely; then rope_theta = the dict's, else the top-level key, else
    10000; rope_type = the dict's, else its legacy `type`, else "default"; for llama3 / yarn /
    longrope original_max_position_embeddings = a top-level key if present (overrides the
    dict), else the dict's, else max_position_embeddings.
  - family defaults for absent keys differ: num_key_value_heads None->heads (llama), 8
    (mistral), 32 (qwen2); max_position_embeddings 2048 / 131072 / 32768; mistral
    sliding_window 4096 (so a mistral config without the key slides every layer); qwen2's
    sliding_window counts only with use_sliding_window, layer i slides iff i >=
    max_window_layers (default 28) unless layer_types is given.
  - biases: llama attention_bias -> q, k, v AND o; mlp_bias -> gate, up, down; qwen2 always
    q, k, v and never o / MLP; mistral none.
  - scores are (q @ k^T) * head_dim**-0.5 with head_dim from the config (not hidden/heads).
  - sliding window: query i sees keys j with i - sliding_window < j <= i (window counts the
    query itself).
  - RoPE attention scaling (yarn, longrope) multiplies cos and sin (float32, before the cast
    to the activation dtype), i.e. q and k each get it: scores scale by its square.
  - dynamic: frequencies depend on seq_len = max(position_ids) + 1 of the forward; only when
    seq_len > max_position_embeddings; the NTK base is then a float32 tensor computation.
  - longrope: long_factor iff seq_len > original_max_position_embeddings (strict), short
    otherwise; attention factor sqrt(1 + ln(factor) / ln(original)) with factor =
    max_position_embeddings / original when absent.
  - yarn: `beta_fast or 32`, `beta_slow or 1`, attention factor from mscale / mscale_all_dim
    only when both are truthy; truncate defaults to true (floor / ceil of the correction
    range) and an explicit null means false.
"""

import copy
from collections import OrderedDict

import torch

# The model every case starts from (a case's cfg updates it).
TINY = dict(
    vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    intermediate_size=96, rms_norm_eps=1e-5, max_position_embeddings=128,
)


# --------------------------------------------------------------------------- #
# Perturbations of hf_llama (cfg, params, x, y) -> (cfg, params, x, y)
# --------------------------------------------------------------------------- #
def p_rope(**changes):
    """rope_parameters updated (None value: key removed)."""
    def f(cfg, params, x, y):
        cfg = copy.deepcopy(cfg)
        for k, v in changes.items():
            if v is None:
                cfg.rope_parameters.pop(k, None)
            else:
                cfg.rope_parameters[k] = v
        cfg.rope_type = cfg.rope_parameters["rope_type"]
        cfg.rope_theta = cfg.rope_parameters["rope_theta"]
        return cfg, params, x, y
    return f


def p_no_scaling(cfg, params, x, y):
    """rope_type default with the same theta."""
    cfg = copy.deepcopy(cfg)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]}
    cfg.rope_type = "default"
    return cfg, params, x, y


def p_attr(**changes):
    def f(cfg, params, x, y):
        cfg = copy.deepcopy(cfg)
        for k, v in changes.items():
            setattr(cfg, k, v(cfg) if callable(v) else v)
        return cfg, params, x, y
    return f


def p_zero(*suffixes):
    """parameters whose names end with one of `suffixes` set to zero."""
    def f(cfg, params, x, y):
        hit = [k for k in params if k.endswith(suffixes)]
        assert hit, suffixes
        params = OrderedDict((k, torch.zeros_like(v) if k in hit else v) for k, v in params.items())
        return cfg, params, x, y
    return f


def p_untie(cfg, params, x, y):
    """the tied embedding gradient without the LM head's contribution (an untied copy)."""
    cfg = copy.deepcopy(cfg)
    cfg.tie_word_embeddings = False
    params = OrderedDict(params)
    params["lm_head.weight"] = params["model.embed_tokens.weight"].clone()
    return cfg, params, x, y


def p_no_qk_norm(cfg, params, x, y):
    """qwen3 without its q/k norms (the parameters dropped with them)."""
    cfg = copy.deepcopy(cfg)
    cfg.qk_norm = False
    params = OrderedDict((k, v) for k, v in params.items() if not k.endswith(("q_norm.weight", "k_norm.weight")))
    return cfg, params, x, y


def p_ids_mod(m):
    def f(cfg, params, x, y):
        return cfg, params, x % m, y % m
    return f


# --------------------------------------------------------------------------- #
# Cases
# --------------------------------------------------------------------------- #
LONG_SHORT = [1.0 + 0.5 * i / 7 for i in range(8)]  # 1.0 .. 1.5, head_dim 16 -> 8 values
LONG_LONG = [float(i + 1) for i in range(8)]  # 1 .. 8
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 500000.0}
LONGROPE = {"rope_type": "longrope", "short_factor": LONG_SHORT, "long_factor": LONG_LONG,
            "original_max_position_embeddings": 12, "rope_theta": 10000.0}


def case(name, family, what, cfg, seq_len=16, batch=2, seed=None, style4x=None, perturb=(), **extra):
    return dict(name=name, family=family, what=what, cfg=dict(TINY, **cfg), seq_len=seq_len, batch=batch,
                seed=seed, style4x=style4x, perturb=list(perturb), **extra)


def moves(desc, fn, key="logits"):
    return dict(desc=desc, fn=fn, key=key, expect="moves")


def same(desc, fn, key="logits", bitwise=False):
    return dict(desc=desc, fn=fn, key=key, expect="bitwise" if bitwise else "same")


CASES = [
    case("llama_rope_theta_5x", "llama", "rope_parameters {rope_type: default, rope_theta: 5e5} (5.x style, as "
         "save_pretrained writes it)",
         dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
         perturb=[moves("rope_theta 1e4 instead of 5e5", p_rope(rope_theta=10000.0))]),
    case("llama_linear", "llama", "rope_type linear, factor 2 (inv_freq / 2)",
         dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
         perturb=[moves("no rope scaling", p_no_scaling)]),
    case("llama_linear_4x_type", "llama", "4.x style: top-level rope_theta 5e5 + rope_scaling {type: linear, "
         "factor: 2} (legacy `type` key; theta from the top level)",
         dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}),
         style4x="type",
         perturb=[moves("no rope scaling", p_no_scaling), moves("rope_theta 1e4 (top-level rope_theta not read)",
                                                                p_rope(rope_theta=10000.0))]),
    case("llama_rope_precedence", "llama", "both keys: rope_scaling {rope_type: linear, factor: 2} + top-level "
         "rope_theta 5e5 win over a stale rope_parameters {default, rope_theta 1e6} (transformers: "
         "`rope_scaling or rope_parameters`, rope_parameters dropped entirely)",
         dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}),
         style4x="both",
         perturb=[moves("rope_parameters used instead (default, theta 1e6)",
                        p_rope(rope_type="default", rope_theta=1e6, factor=None))]),
    case("llama_dynamic_below", "llama", "rope_type dynamic factor 2, max_position_embeddings 32, T=16 <= 32: "
         "no NTK rescaling (== default rope)",
         dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
              max_position_embeddings=32),
         perturb=[same("control: default rope gives bitwise the same", p_no_scaling, bitwise=True),
                  moves("linear factor 2 instead", p_rope(rope_type="linear"))]),
    case("llama_dynamic_above", "llama", "rope_type dynamic factor 2, max_position_embeddings 8, T=16 > 8: "
         "base = theta * (factor*T/max - (factor-1)) ** (D/(D-2)) computed as a float32 tensor",
         dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
              max_position_embeddings=8),
         perturb=[moves("no rescaling (frequencies of T <= max)", p_no_scaling)],
         dynamic_base_info=True),
    case("llama3", "llama", "rope_type llama3 factor 8, low/high_freq_factor 1/4, original_max_position_embeddings "
         "64, rope_theta 5e5, max_position_embeddings 256 (frequencies in all three bands)",
         dict(rope_parameters=dict(LLAMA3), max_position_embeddings=256), seed=7,
         perturb=[moves("no rope scaling", p_no_scaling),
                  moves("every frequency / factor (linear 8)", p_rope(rope_type="linear"))],
         llama3_bands=True),
    case("llama3_4x_style", "llama", "llama3 (same config, seed and batch as `llama3`) written 4.x style: top-level "
         "rope_theta + rope_scaling {rope_type: llama3, ...}",
         dict(rope_parameters=dict(LLAMA3), max_position_embeddings=256), seed=7, style4x="rope_type",
         same_as="llama3", perturb=[moves("no rope scaling", p_no_scaling)]),
    case("llama_yarn", "llama", "rope_type yarn factor 4, original_max_position_embeddings 32, max_position_embeddings "
         "128, default attention factor 0.1 ln(4) + 1 on cos/sin, beta 32/1, truncate",
         dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                               "rope_theta": 10000.0}, max_position_embeddings=128),
         perturb=[moves("no rope scaling", p_no_scaling), moves("attention factor 1", p_rope(attention_factor=1.0))]),
    case("llama_yarn_mscale", "llama", "rope_type yarn factor 4, mscale 1, mscale_all_dim 0.5, beta_fast 16, "
         "beta_slow 2, truncate false, original_max_position_embeddings 256, max_position_embeddings 1024 "
         "(correction range 0.81..2.62 unrounded)",
         dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                               "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16.0, "beta_slow": 2.0,
                               "truncate": False, "rope_theta": 10000.0}, max_position_embeddings=1024),
         perturb=[moves("mscale ignored (default attention factor)", p_rope(mscale=None, mscale_all_dim=None)),
                  moves("truncate true", p_rope(truncate=True)),
                  moves("beta_fast/beta_slow defaults 32/1", p_rope(beta_fast=None, beta_slow=None))]),
    case("llama_longrope_below", "llama", "rope_type longrope, short_factor 1.0..1.5, long_factor 1..8, "
         "original_max_position_embeddings 12, max_position_embeddings 48, T=8 <= 12: short_factor; attention "
         "factor sqrt(1 + ln 4 / ln 12)",
         dict(rope_parameters=dict(LONGROPE), max_position_embeddings=48), seq_len=8,
         perturb=[moves("long_factor instead", p_rope(short_factor=LONG_LONG)),
                  moves("attention factor 1", p_rope(attention_factor=1.0))]),
    case("llama_longrope_above", "llama", "longrope as above, T=16 > 12: long_factor",
         dict(rope_parameters=dict(LONGROPE), max_position_embeddings=48), seq_len=16,
         perturb=[moves("short_factor instead", p_rope(long_factor=LONG_SHORT))]),
    case("llama_head_dim", "llama", "head_dim 32 with hidden 64 and 4 heads (q_proj [128, 64], o_proj [64, 128]; "
         "scaling 32**-0.5)",
         dict(head_dim=32),
         perturb=[moves("score scaling (hidden/heads)**-0.5 = 16**-0.5", p_attr(attn_scaling=16 ** -0.5))]),
    case("llama_bias", "llama", "attention_bias and mlp_bias: q/k/v/o and gate/up/down biases, untied",
         dict(attention_bias=True, mlp_bias=True),
         perturb=[moves("q/k/v biases dropped", p_zero("q_proj.bias", "k_proj.bias", "v_proj.bias")),
                  moves("o_proj bias dropped", p_zero("o_proj.bias")),
                  moves("MLP biases dropped", p_zero("gate_proj.bias", "up_proj.bias", "down_proj.bias"))]),
    case("llama_tied", "llama", "tie_word_embeddings with attention_bias (no lm_head.weight; embedding grad = "
         "lookup + head)",
         dict(tie_word_embeddings=True, attention_bias=True),
         perturb=[moves("embedding grad without the head's part", p_untie, key="grad.model.embed_tokens.weight"),
                  moves("attention biases dropped", p_zero("_proj.bias"))]),
    case("mistral_window", "mistral", "MistralConfig sliding_window 5 (every layer), T=16, head_dim 32 != 64/4",
         dict(sliding_window=5, head_dim=32),
         perturb=[moves("window widened to T (plain causal)", p_attr(sliding_window=16)),
                  moves("window 6 (off by one)", p_attr(sliding_window=6))]),
    case("qwen2_window", "qwen2", "Qwen2Config use_sliding_window, sliding_window 6, max_window_layers 1 (layer 0 "
         "full, layer 1 slides), q/k/v biases, tied, rope_theta 1e6",
         dict(use_sliding_window=True, sliding_window=6, max_window_layers=1, tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
         perturb=[moves("no sliding window", p_attr(layer_types=["full_attention"] * 2)),
                  moves("layer 0 slides instead of layer 1",
                        p_attr(layer_types=["sliding_attention", "full_attention"])),
                  moves("q/k/v biases dropped", p_zero("_proj.bias"))]),
    case("qwen2_layer_types", "qwen2", "Qwen2Config explicit layer_types [sliding_attention, full_attention], "
         "use_sliding_window, sliding_window 4 (max_window_layers 28 would make both full), untied",
         dict(use_sliding_window=True, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
         perturb=[moves("layer_types derived from max_window_layers (all full)",
                        p_attr(layer_types=["full_attention"] * 2)),
                  moves("layer types swapped", p_attr(layer_types=["full_attention", "sliding_attention"]))]),
    case("llama_vocab_128k", "llama", "vocab_size 128256 (ids > 65535), hidden 16, 2 heads, 1 KV head, 1 layer, "
         "intermediate 32, tied, T=8, B=1",
         dict(vocab_size=128256, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
              intermediate_size=32, tie_word_embeddings=True),
         seq_len=8, batch=1,
         perturb=[moves("token ids truncated to 16 bits", p_ids_mod(65536))], min_ids_above_65535=3),
    # Mixture of experts (model/moe.h). Router weights N(0, 0.3) so routing differs per token.
    case("mixtral_aux", "mixtral", "MixtralConfig 4 experts, top-2 (renormalised), intermediate 32, "
         "output_router_logits true, router_aux_loss_coef 0.05: loss = CE + 0.05 * load-balancing loss",
         dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, output_router_logits=True,
              router_aux_loss_coef=0.05),
         perturb=[moves("top-1 instead of top-2", p_attr(num_experts_per_tok=1)),
                  moves("top-k weights not renormalised", p_attr(norm_topk_prob=False)),
                  moves("aux loss left out", p_attr(output_router_logits=False), key="loss"),
                  moves("aux loss left out (router gradient)", p_attr(output_router_logits=False),
                        key="grad.model.layers.0.mlp.gate.weight")]),
    case("mixtral_window", "mixtral", "MixtralConfig 3 experts, top-2, sliding_window 6, output_router_logits "
         "false (default: no aux loss), T=16",
         dict(num_local_experts=3, num_experts_per_tok=2, intermediate_size=32, sliding_window=6),
         perturb=[moves("top-1 instead of top-2", p_attr(num_experts_per_tok=1)),
                  moves("no sliding window", p_attr(layer_types=["full_attention"] * 2, sliding_window=None)),
                  moves("aux loss added", p_attr(output_router_logits=True, router_aux_loss_coef=0.05),
                        key="loss")]),
    case("mixtral_fused_file", "mixtral", "mixtral_aux with model.safetensors holding transformers 5's fused "
         "in-memory tensors (mlp.experts.gate_up_proj / down_proj, mlp.gate) instead of per-expert w1/w2/w3",
         dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, output_router_logits=True,
              router_aux_loss_coef=0.05),
         seed=1000 + 19, fused_file=True, same_as="mixtral_aux",
         perturb=[moves("top-1 instead of top-2", p_attr(num_experts_per_tok=1))]),
    case("qwen2_moe_shared", "qwen2_moe", "Qwen2MoeConfig 4 experts top-2, norm_topk_prob false, "
         "moe_intermediate 16, shared expert 24 with sigmoid gate, mlp_only_layers [1] (layer 1 dense, "
         "intermediate 48), q/k/v biases, output_router_logits true, coef 0.05",
         dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, moe_intermediate_size=16,
              shared_expert_intermediate_size=24, intermediate_size=48, mlp_only_layers=[1],
              output_router_logits=True, router_aux_loss_coef=0.05),
         perturb=[moves("top-k weights renormalised", p_attr(norm_topk_prob=True)),
                  moves("shared expert dropped", p_zero("shared_expert.down_proj.weight")),
                  moves("shared expert ungated (gate logit 0 -> x0.5)", p_zero("shared_expert_gate.weight")),
                  moves("aux loss left out", p_attr(output_router_logits=False), key="loss")]),
    case("qwen2_moe_sparse_step", "qwen2_moe", "Qwen2MoeConfig 3 layers, decoder_sparse_step 2 (only layer 1 "
         "sparse), 5 experts top-3, norm_topk_prob true, no q/k/v bias (qkv_bias false), no aux loss",
         dict(num_hidden_layers=3, num_experts=5, num_experts_per_tok=3, norm_topk_prob=True,
              moe_intermediate_size=16, shared_expert_intermediate_size=24, intermediate_size=48,
              decoder_sparse_step=2, qkv_bias=False),
         perturb=[moves("top-k weights not renormalised", p_attr(norm_topk_prob=False)),
                  moves("top-2 instead of top-3", p_attr(num_experts_per_tok=2))]),
    case("qwen3_qk_norm", "qwen3", "Qwen3Config (dense): q_norm / k_norm per head before RoPE, attention_bias "
         "(q/k/v/o), head_dim 32 (not 64/4; transformers' default is 128)",
         dict(head_dim=32, attention_bias=True),
         perturb=[moves("q/k norms left out", p_no_qk_norm),
                  moves("o_proj bias dropped", p_zero("o_proj.bias"))]),
    case("qwen3_moe_aux", "qwen3_moe", "Qwen3MoeConfig 4 experts top-2, norm_topk_prob true, moe_intermediate 16, "
         "no shared expert, mlp_only_layers [0] (layer 0 dense, intermediate 48), q/k norms, "
         "output_router_logits true, coef 0.05",
         dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, moe_intermediate_size=16,
              intermediate_size=48, mlp_only_layers=[0], output_router_logits=True, router_aux_loss_coef=0.05),
         perturb=[moves("top-k weights not renormalised", p_attr(norm_topk_prob=False)),
                  moves("q/k norms left out", p_no_qk_norm),
                  moves("aux loss left out", p_attr(output_router_logits=False), key="loss")]),
]


# config.json dicts whose reading (defaults, rope key precedence) hf_llama must share with transformers
CONFIG_READING = [
    ("llama", {}),
    ("mistral", {}),
    ("qwen2", {}),
    ("llama", {"rope_theta": 5e5}),
    ("llama", {"rope_theta": 5e5, "rope_scaling": {"type": "dynamic", "factor": 2.0}}),
    ("llama", {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
               "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    ("llama", {"rope_theta": 7e5, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
    ("llama", {"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 3.0}}),
    ("llama", {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}),
    ("llama", {"max_position_embeddings": 4096, "original_max_position_embeddings": 1024,
               "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               "rope_theta": 5e5, "max_position_embeddings": 131072}),
    ("llama", {"num_key_value_heads": None, "head_dim": 256, "attention_bias": True}),
    ("mistral", {"sliding_window": None, "num_key_value_heads": 4, "head_dim": 128}),  # (kv null: invalid for mistral)
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 3, "num_hidden_layers": 5}),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 8, "head_dim": 32}),
    ("qwen2", {"use_sliding_window": True, "num_hidden_layers": 3,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
]
