#!/usr/bin/env python3
"""Sanity checks of the HF Llama transcription (hf_llama.py) and the golden files.

    /opt/shardlm/venv/bin/python tests/reference/check_reference.py

Checks that the transcription behaves like a Llama model should, and that the
golden values are sensitive to every convention the C++ side must get right:
a "bug variant" of the reference (wrong RoPE layout, eps placement, GQA head
mapping, ...) must move the golden logits by far more than the 1e-5 tolerance.
Then the Llama-family features of hf_llama.py without transformers (make_family_cases.py
compares them with transformers): config reading (4.x / 5.x rope keys, precedence,
family defaults), biases, head_dim, the sliding-window mask and its receptive field,
and rope scalings that degenerate to the default rope.
Exits non-zero on failure.
"""

import math
import os
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_golden  # noqa: E402  (first: it pins torch's CPU code paths before torch loads)
import hf_llama  # noqa: E402
import hf_llama_rope  # noqa: E402
import safetensors_py  # noqa: E402
from worst import worst as worst_of  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(1)
FAILED = []


def check(cond, msg):
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        FAILED.append(msg)


def rel_change(a, b):
    """max |a-b| / max |b|"""
    return ((a - b).abs().max() / b.abs().max()).item()


def tiny(tie=False):
    cfg_dict = dict(make_golden.TINY_CONFIG)
    cfg_dict["tie_word_embeddings"] = tie
    cfg = hf_llama.LlamaConfig.from_dict(cfg_dict)
    return cfg, make_golden.init_params(cfg)


class patched:
    """Temporarily replace module-level functions of the reference (bug variants), in every module
    of it that holds the name (hf_llama re-exports hf_llama_rope's, which calls its own)."""

    MODULES = (hf_llama, hf_llama_rope)

    def __init__(self, **repl):
        self.repl = repl

    def __enter__(self):
        self.saved = [(m, k, getattr(m, k)) for m in self.MODULES for k in self.repl if hasattr(m, k)]
        assert {k for _, k, _ in self.saved} == set(self.repl), self.repl
        for m, k, _ in self.saved:
            setattr(m, k, self.repl[k])

    def __exit__(self, *exc):
        for m, k, v in self.saved:
            setattr(m, k, v)


# ----- bug variants ---------------------------------------------------------- #
def rope_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Meta/GPT-J style RoPE: rotate adjacent pairs (x[2j], x[2j+1]) by freq j."""
    half = cos.shape[-1] // 2
    c = cos[..., :half].repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    s = sin[..., :half].repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)

    def rot(x):
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x_odd, x_even), dim=-1).flatten(-2)

    return q * c + rot(q) * s, k * c + rot(k) * s


def rope_none(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


def repeat_kv_tiled(x, n_rep):
    """Wrong GQA mapping: query head h uses kv head h % nKV."""
    return x.repeat(1, n_rep, 1, 1)


def rms_norm_eps_outside(x, weight, eps):
    dt = x.dtype
    x = x.float()
    return weight * (x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)).to(dt)


def rms_norm_no_weight(x, weight, eps):
    return hf_llama.__dict__["_orig_rms_norm"](x, torch.ones_like(weight), eps)


def no_causal_mask(seq_len, dtype, device=None):
    return torch.zeros(1, 1, seq_len, seq_len, dtype=dtype)


def mlp_swapped(params, prefix, x):
    gate = F.linear(x, params[prefix + "gate_proj.weight"])
    up = F.linear(x, params[prefix + "up_proj.weight"])
    return F.linear(gate * F.silu(up), params[prefix + "down_proj.weight"])


def inv_freq_wrong_theta(head_dim, rope_theta, dtype=torch.float32):
    return hf_llama.__dict__["_orig_inv_freq"](head_dim, 500000.0, dtype)


def inv_freq_denominator_half(head_dim, rope_theta, dtype=torch.float32):
    """Wrong exponent: arange(0, D/2)/ (D/2) instead of arange(0, D, 2)/D -- same
    values! (kept as a control: must give ~0 change)"""
    e = torch.arange(0, head_dim // 2, dtype=torch.int64).to(dtype) / (head_dim // 2)
    return 1.0 / (rope_theta ** e)


# ----- Llama-family features (rope scaling, biases, head_dim, sliding windows, config reading) ----- #
def family_cfg(**kw):
    d = dict(make_golden.TINY_CONFIG)
    d.update(kw)
    return hf_llama.LlamaConfig.from_dict(d)


def seeded(cfg, seed=5):
    """make_golden.init_params, but biases ~ N(0, 0.1) (init_params treats every 1-D tensor as a norm weight)."""
    params = make_golden.init_params(cfg, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for k in params:
        if k.endswith(".bias"):
            params[k] = 0.1 * torch.randn(params[k].shape, generator=gen)
    return params


def family_checks():
    T = 16
    x = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(3))
    base_cfg = family_cfg()

    print("config reading (transformers 5.x semantics)")
    five = family_cfg(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    four = family_cfg(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    both = family_cfg(rope_theta=5e5, rope_scaling={"rope_type": "linear", "factor": 2.0},
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    check(five.rope_parameters == {k: v for k, v in four.rope_parameters.items() if k != "type"}
          and four.rope_type == "linear" and four.rope_theta == 5e5,
          f"4.x rope_theta + rope_scaling{{type}} == 5.x rope_parameters ({four.rope_parameters})")
    check(both.rope_type == "linear" and both.rope_theta == 5e5,
          "a non-empty rope_scaling replaces rope_parameters entirely (theta from the top level)")
    check(family_cfg(rope_theta=7e5, rope_parameters={"rope_type": "default", "rope_theta": 5e5}).rope_theta == 5e5,
          "rope_parameters' rope_theta wins over a top-level rope_theta")
    check(hf_llama.LlamaConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4}).rope_theta == 1e4,
          "rope_theta defaults to 10000")
    y = family_cfg(max_position_embeddings=128, original_max_position_embeddings=64,
                   rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16})
    check(y.rope_parameters["original_max_position_embeddings"] == 64,
          "a top-level original_max_position_embeddings overrides the rope dict's (Phi3 exception)")
    y = family_cfg(max_position_embeddings=128, rope_parameters={"rope_type": "yarn", "factor": 2.0})
    check(y.rope_parameters["original_max_position_embeddings"] == 128,
          "yarn/longrope/llama3 original_max_position_embeddings defaults to max_position_embeddings")
    m = hf_llama.LlamaConfig.from_dict({"model_type": "mistral"})
    check(m.num_key_value_heads == 8 and m.max_position_embeddings == 131072 and m.sliding_window == 4096
          and m.layer_types == ["sliding_attention"] * 32 and not (m.qkv_bias or m.o_bias or m.mlp_bias),
          "mistral defaults: 8 KV heads, 131072 positions, sliding_window 4096 on every layer, no biases")
    m = hf_llama.LlamaConfig.from_dict({"model_type": "mistral", "sliding_window": None})
    check(m.layer_types == ["full_attention"] * 32, "mistral sliding_window null: full attention")
    q = hf_llama.LlamaConfig.from_dict({"model_type": "qwen2", "sliding_window": 8})
    check(q.num_key_value_heads == 32 and q.vocab_size == 151936 and q.sliding_window is None
          and q.layer_types == ["full_attention"] * 32 and q.qkv_bias and not q.o_bias and not q.mlp_bias,
          "qwen2 defaults: 32 KV heads, sliding_window ignored without use_sliding_window, q/k/v biases only")
    q = hf_llama.LlamaConfig.from_dict({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
                                        "num_hidden_layers": 4, "max_window_layers": 2})
    check(q.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2,
          f"qwen2 layer_types derived from max_window_layers: {q.layer_types}")
    try:
        hf_llama.LlamaConfig.from_dict({"model_type": "qwen2", "num_hidden_layers": 1,
                                        "layer_types": ["sliding_attention"]})
        check(False, "qwen2 sliding layer without use_sliding_window must raise")
    except ValueError:
        check(True, "qwen2 sliding layer without use_sliding_window raises (as transformers' mask does)")

    print("parameters with biases and head_dim != hidden/heads")
    bcfg = family_cfg(attention_bias=True, mlp_bias=True)
    names = list(hf_llama.param_shapes(bcfg))
    check(names[1:5] == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                         "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias"]
          and "model.layers.0.mlp.down_proj.bias" in names and "model.layers.0.self_attn.o_proj.bias" in names,
          "bias right after its weight")
    hcfg = family_cfg(head_dim=32)
    hs = hf_llama.param_shapes(hcfg)
    check(hs["model.layers.0.self_attn.q_proj.weight"] == (128, 64) and hs["model.layers.0.self_attn.o_proj.weight"]
          == (64, 128) and hcfg.attn_scaling == 32 ** -0.5, "head_dim 32: q_proj [128, 64], o_proj [64, 128]")
    with torch.no_grad():
        hp = make_golden.init_params(hcfg, 5)
        lh = hf_llama.forward(hp, hcfg, x)
    check(tuple(lh.shape) == (2, T, 128) and torch.isfinite(lh).all().item(), "head_dim 32 model runs")
    bparams = seeded(bcfg)
    zero = OrderedDict((k, torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in bparams.items())
    nob = OrderedDict((k, v) for k, v in bparams.items() if not k.endswith(".bias"))
    with torch.no_grad():
        lz = hf_llama.forward(zero, bcfg, x)
        ln = hf_llama.forward(nob, base_cfg, x)
        lb = hf_llama.forward(bparams, bcfg, x)
    check(rel_change(lz, ln) < 1e-6, f"zero biases == no biases ({rel_change(lz, ln):.1e})")
    check(rel_change(lb, ln) > 1e-2, f"biases matter ({rel_change(lb, ln):.1e})")
    try:
        hf_llama.forward(nob, bcfg, x)
        check(False, "missing bias parameters must raise")
    except KeyError:
        check(True, "missing bias parameters raise KeyError")

    print("sliding window")
    for w in (1, 3, 5):
        mask = hf_llama.sliding_window_causal_mask(6, w, torch.float32)[0, 0]
        want = torch.tensor([[0.0 if (j <= i and j > i - w) else torch.finfo(torch.float32).min for j in range(6)]
                             for i in range(6)])
        check(torch.equal(mask, want), f"window {w}: key j visible from query i iff i - {w} < j <= i")
    params = make_golden.init_params(base_cfg, 5)
    mis = dict(make_golden.TINY_CONFIG, model_type="mistral")
    with torch.no_grad():
        l_full = hf_llama.forward(params, base_cfg, x)
        l_wT = hf_llama.forward(params, hf_llama.LlamaConfig.from_dict(dict(mis, sliding_window=T)), x)
        l_w4 = hf_llama.forward(params, hf_llama.LlamaConfig.from_dict(dict(mis, sliding_window=4)), x)
    check(torch.equal(l_wT, l_full), "sliding_window >= T: bitwise the full causal result")
    check(rel_change(l_w4, l_full) > 1e-2, f"sliding_window 4 matters ({rel_change(l_w4, l_full):.1e})")
    one = hf_llama.LlamaConfig.from_dict(dict(mis, sliding_window=4, num_hidden_layers=1))
    p1 = make_golden.init_params(one, 5)
    x2 = x.clone()
    x2[:, 6] = (x2[:, 6] + 1) % 128
    with torch.no_grad():
        a, b = hf_llama.forward(p1, one, x), hf_llama.forward(p1, one, x2)
    moved = [s for s in range(T) if not torch.equal(a[:, s], b[:, s])]
    check(moved == [6, 7, 8, 9], f"1 layer, window 4: token 6 reaches exactly positions 6..9 ({moved})")

    print("rope scaling: degenerate settings reduce to the default rope; f64 path computes the same")
    pos = torch.arange(T)[None]
    inv0, s0 = hf_llama.rope_for_forward(base_cfg, pos)
    ones = [1.0] * 8
    variants = {
        "linear factor 1": dict(rope_type="linear", factor=1.0),
        "dynamic T <= max": dict(rope_type="dynamic", factor=2.0),
        "longrope all-ones factors, attention_factor 1": dict(rope_type="longrope", short_factor=ones,
                                                               long_factor=ones, attention_factor=1.0,
                                                               original_max_position_embeddings=4),
    }
    for desc, rp in variants.items():
        c = family_cfg(rope_parameters=dict(rp, rope_theta=1e4))
        inv, s = hf_llama.rope_for_forward(c, pos)
        check(torch.equal(inv, inv0) and s == 1.0, f"{desc}: bitwise the default inv_freq")
    close = {
        "yarn factor 1": dict(rope_type="yarn", factor=1.0, original_max_position_embeddings=32),
        "llama3 factor 1": dict(rope_type="llama3", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=32),
    }
    for desc, rp in close.items():
        c = family_cfg(rope_parameters=dict(rp, rope_theta=1e4))
        inv, s = hf_llama.rope_for_forward(c, pos)
        check(rel_change(inv, inv0) < 1e-6 and s == 1.0, f"{desc}: the default inv_freq ({rel_change(inv, inv0):.1e})")
    yarn = family_cfg(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                       "rope_theta": 1e4})
    check(hf_llama.rope_init(yarn)[1] == 0.1 * math.log(4.0) + 1.0, "yarn attention factor 0.1 ln(factor) + 1")
    yarn_m = family_cfg(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                         "rope_theta": 1e4, "mscale": 1.0, "mscale_all_dim": 0.5})
    check(abs(hf_llama.rope_init(yarn_m)[1] - (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1)) < 1e-15,
          "yarn mscale/mscale_all_dim attention factor")
    lr = family_cfg(max_position_embeddings=48, rope_parameters={
        "rope_type": "longrope", "short_factor": ones, "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 12, "rope_theta": 1e4})
    check(abs(hf_llama.rope_init(lr)[1] - math.sqrt(1 + math.log(4) / math.log(12))) < 1e-15,
          "longrope attention factor sqrt(1 + ln(max/orig) / ln(orig))")
    i12, _ = hf_llama.rope_for_forward(lr, torch.arange(12)[None])
    i13, _ = hf_llama.rope_for_forward(lr, torch.arange(13)[None])
    check(torch.equal(i12, inv0) and rel_change(i13, inv0 / 2) < 1e-6,
          "longrope: short factors for T = 12 = original max, long ones for T = 13")
    dyn = family_cfg(max_position_embeddings=8, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                 "rope_theta": 1e4})
    inv_d, _ = hf_llama.rope_for_forward(dyn, pos)
    ntk = 1e4 * (2.0 * T / 8 - 1.0) ** (16 / 14)
    want = 1.0 / ntk ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    check(rel_change(inv_d.double(), want) < 1e-6, "dynamic, T > max: base theta * (f T / max - (f - 1))^(D/(D-2))")
    l3 = family_cfg(max_position_embeddings=256, rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64, rope_theta=5e5))
    for c in (five, dyn, yarn, yarn_m, lr, l3):
        for t in (8, 16):
            p_ = torch.arange(t)[None]
            a32, s32 = hf_llama.rope_for_forward(c, p_, torch.float32)
            a64, s64 = hf_llama.rope_for_forward(c, p_, torch.float64)
            if not (a64.dtype == torch.float64 and rel_change(a32.double(), a64) < 1e-6 and s32 == s64):
                check(False, f"{c.rope_type} T={t}: float64 rope path differs from float32 "
                      f"({rel_change(a32.double(), a64):.1e})")
                break
        else:
            continue
        break
    else:
        check(True, "float64 rope path == float32 one up to rounding for linear, dynamic, yarn, longrope, llama3")


def main():
    hf_llama._orig_rms_norm = hf_llama.rms_norm
    hf_llama._orig_inv_freq = hf_llama.rotary_inv_freq
    cfg, params = tiny()
    x, y = make_golden.make_batch(cfg)
    with torch.no_grad():
        logits = hf_llama.forward(params, cfg, x)
        loss = hf_llama.loss_fn(logits, y)

    print("(i) loss magnitude")
    check(abs(loss.item() - math.log(cfg.vocab_size)) < 0.3,
          f"loss {loss.item():.6f} ~ ln(V) = {math.log(cfg.vocab_size):.6f}")
    check(logits.dtype == torch.float32 and tuple(logits.shape) == (2, 16, 128), "logits f32 [2,16,128]")

    print("(ii) every norm weight matters")
    for name in ["model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                 "model.norm.weight"]:
        p2 = OrderedDict(params)
        p2[name] = params[name].clone()
        p2[name][3] += 0.05
        with torch.no_grad():
            l2 = hf_llama.forward(p2, cfg, x)
        check(rel_change(l2, logits) > 1e-4, f"perturb {name}[3]: rel change {rel_change(l2, logits):.2e}")
    check(all((params[n] - 1).abs().max() > 0.05 for n in params if n.endswith("norm.weight")),
          "norm weights are not all ones")

    print("(iii) causality")
    t = 8
    x2 = x.clone()
    x2[:, t] = (x2[:, t] + 1) % cfg.vocab_size
    with torch.no_grad():
        l2 = hf_llama.forward(params, cfg, x2)
    before = (l2[:, :t] - logits[:, :t]).abs().max().item()
    after = (l2[:, t:] - logits[:, t:]).abs().min(dim=-1).values.max().item()
    check(before == 0.0, f"positions < {t} unchanged (max diff {before:.1e}, bitwise)")
    check(all((l2[:, s] - logits[:, s]).abs().max() > 1e-4 for s in range(t, 16)),
          f"every position >= {t} changed")

    print("(iv)/(v) conventions; shapes")
    check(tuple(params["model.layers.0.self_attn.k_proj.weight"].shape) == (32, 64), "k_proj [2*16, 64]")
    check(tuple(params["model.layers.0.self_attn.v_proj.weight"].shape) == (32, 64), "v_proj [2*16, 64]")
    check(tuple(params["model.layers.0.self_attn.q_proj.weight"].shape) == (64, 64), "q_proj [64, 64]")
    check(tuple(params["model.layers.0.mlp.down_proj.weight"].shape) == (64, 176), "down_proj [64, 176]")

    # Attention is not uniform (so RoPE / masking / scale actually matter).
    with torch.no_grad():
        h = hf_llama.rms_norm(F.embedding(x, params["model.embed_tokens.weight"]),
                              params["model.layers.0.input_layernorm.weight"], cfg.rms_norm_eps)
        q = F.linear(h, params["model.layers.0.self_attn.q_proj.weight"]).view(2, 16, 4, 16).transpose(1, 2)
        k = F.linear(h, params["model.layers.0.self_attn.k_proj.weight"]).view(2, 16, 2, 16).transpose(1, 2)
        inv = hf_llama.rotary_inv_freq(16, cfg.rope_theta)
        cos, sin = hf_llama.rotary_cos_sin(inv, torch.arange(16)[None].expand(2, 16), torch.float32)
        q, k = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
        k = hf_llama.repeat_kv(k, 2)
        a = torch.softmax(q @ k.transpose(2, 3) / 4 + hf_llama.causal_mask(16, torch.float32), -1)
        last = a[:, :, -1, :]  # attention of the last query over 16 keys
        spread = (last.max(-1).values / last.min(-1).values).min().item()
    check(spread > 1.5, f"layer-0 attention not uniform: min over heads of max/min weight = {spread:.2f}")

    print("bug variants: max|d logits|/max|logits| vs golden (must be >> 1e-5)")
    variants = [
        ("interleaved (GPT-J/Meta) RoPE instead of rotate_half", dict(apply_rotary_pos_emb=rope_interleaved)),
        ("no RoPE", dict(apply_rotary_pos_emb=rope_none)),
        ("rope_theta 5e5 instead of 1e4", dict(rotary_inv_freq=inv_freq_wrong_theta)),
        ("GQA kv head h % nKV instead of h // n_rep", dict(repeat_kv=repeat_kv_tiled)),
        ("RMSNorm eps outside sqrt", dict(rms_norm=rms_norm_eps_outside)),
        ("RMSNorm weight ignored", dict(rms_norm=rms_norm_no_weight)),
        ("no causal mask", dict(causal_mask=no_causal_mask)),
        ("MLP silu on up instead of gate", dict(mlp=mlp_swapped)),
    ]
    for desc, repl in variants:
        with patched(**repl), torch.no_grad():
            lv = hf_llama.forward(params, cfg, x)
            lossv = hf_llama.loss_fn(lv, y)
        rc = rel_change(lv, logits)
        check(rc > 1e-3, f"{desc}: {rc:.2e} (loss {lossv.item():.6f} vs {loss.item():.6f})")
    with patched(rotary_inv_freq=inv_freq_denominator_half), torch.no_grad():
        lv = hf_llama.forward(params, cfg, x)
    check(rel_change(lv, logits) < 1e-6, "control: arange(0,D/2)/(D/2) == arange(0,D,2)/D exponent "
          f"(change {rel_change(lv, logits):.1e})")
    # RoPE is relative: shifting all positions leaves logits unchanged up to rounding
    with torch.no_grad():
        lshift = hf_llama.forward(params, cfg, x, position_ids=torch.arange(3, 19)[None].expand(2, 16))
    check(rel_change(lshift, logits) < 1e-5, "note: positions+3 gives the same logits up to rounding "
          f"({rel_change(lshift, logits):.1e}); a position offset bug is NOT caught by these goldens")

    print("GQA == MHA with k/v heads repeated (query head h -> kv head h // n_rep)")
    mha_dict = dict(make_golden.TINY_CONFIG)
    mha_dict["num_key_value_heads"] = 4
    mha_cfg = hf_llama.LlamaConfig.from_dict(mha_dict)
    mha = OrderedDict(params)
    for i in range(cfg.num_hidden_layers):
        for kv in ("k_proj", "v_proj"):
            n = f"model.layers.{i}.self_attn.{kv}.weight"
            mha[n] = params[n].view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
    with torch.no_grad():
        lm = hf_llama.forward(mha, mha_cfg, x)
    check(rel_change(lm, logits) < 1e-6, f"GQA vs expanded MHA: {rel_change(lm, logits):.1e}")

    print("loss conventions")
    seq = torch.cat([x, y[:, -1:]], dim=1)
    with torch.no_grad():
        lhf = hf_llama.hf_labels_loss(hf_llama.forward(params, cfg, seq), seq)
    check(abs(lhf.item() - loss.item()) < 1e-6,
          f"loss_fn(forward(seq[:, :-1]), seq[:, 1:]) == HF labels loss on seq ({loss.item():.7f} vs {lhf.item():.7f})")

    print("tied embeddings: grad(embed, tied) == grad(embed) + grad(lm_head) of an untied copy")
    tcfg, tparams = tiny(tie=True)
    check("lm_head.weight" not in tparams, "tied params have no lm_head.weight")
    _, _, tg = make_golden.run_model(tparams, tcfg, x, y, torch.float32)
    unt = OrderedDict(tparams)
    unt["lm_head.weight"] = tparams["model.embed_tokens.weight"].clone()
    _, _, ug = make_golden.run_model(unt, cfg, x, y, torch.float32)
    summed = ug["model.embed_tokens.weight"] + ug["lm_head.weight"]
    check(rel_change(tg["model.embed_tokens.weight"], summed) < 1e-5,
          f"tied grad = sum ({rel_change(tg['model.embed_tokens.weight'], summed):.1e})")
    head_share = (ug["lm_head.weight"].norm() / ug["model.embed_tokens.weight"].norm()).item()
    check(head_share > 0.1, f"head contribution is substantial (|g_head|/|g_embed| = {head_share:.2f})")

    print("golden files on disk reproduce")
    for name, tie in (("tiny", False), ("tiny_tied", True)):
        gdir = os.path.join(make_golden.GOLDEN, name)
        gcfg = hf_llama.LlamaConfig.from_json_file(os.path.join(gdir, "config.json"))
        gparams, meta = safetensors_py.load_file(os.path.join(gdir, "model.safetensors"))
        parity, _ = safetensors_py.load_file(os.path.join(gdir, "parity.safetensors"))
        check(list(gparams) == list(hf_llama.param_shapes(gcfg)), f"{name}: parameter names/order")
        lg, ls, gg = make_golden.run_model(gparams, gcfg, parity["input_ids"], parity["targets"], torch.float32)
        check(torch.equal(lg, parity["logits"]) and torch.equal(ls, parity["loss"]),
              f"{name}: logits/loss bitwise equal on recompute (loss {parity['loss'].item()!r})")
        check(all(torch.equal(gg[k], parity["grad." + k]) for k in gg) and
              len([k for k in parity if k.startswith("grad.")]) == len(gg), f"{name}: all grads present and equal")
        check(parity["loss"].shape == torch.Size([]) and parity["input_ids"].dtype == torch.int64,
              f"{name}: dtypes/shapes")

    ad, _ = safetensors_py.load_file(os.path.join(make_golden.GOLDEN, "adamw.safetensors"))
    n = ad["total_norm"]
    check(((n > 1).sum() > 0 and (n < 1).sum() > 0).item(), f"adamw: clipping on some steps only ({n.tolist()})")
    # independent re-implementation of the AdamW + clipping recurrence, float64
    w, b = ad["init.w"].double(), ad["init.b"].double()
    st = {"w": [torch.zeros_like(w), torch.zeros_like(w)], "b": [torch.zeros_like(b), torch.zeros_like(b)]}
    worst = 0.0
    for k in range(6):
        gw, gb = ad[f"grad.{k}.w"].double(), ad[f"grad.{k}.b"].double()
        tn = math.sqrt(gw.pow(2).sum().item() + gb.pow(2).sum().item())
        coef = min(1.0, 1.0 / (tn + 1e-6))
        lr = 1e-2 * (k + 1) / 6
        t = k + 1
        newp = {}
        for name, p, g, wd in (("w", w, gw * coef, 0.1), ("b", b, gb * coef, 0.0)):
            m, v = st[name]
            p = p * (1 - lr * wd)
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.95).addcmul_(g, g, value=0.05)
            denom = v.sqrt() / math.sqrt(1 - 0.95 ** t) + 1e-8
            newp[name] = p - (lr / (1 - 0.9 ** t)) * m / denom
        w, b = newp["w"], newp["b"]
        worst = worst_of(worst, abs(tn - n[k].item()) / tn,
                    rel_change(ad[f"after.{k}.w"].double(), w), rel_change(ad[f"after.{k}.b"].double(), b))
    check(worst < 1e-6, f"adamw: independent float64 recurrence matches golden (worst rel {worst:.1e})")

    family_checks()

    if FAILED:
        print(f"\n{len(FAILED)} check(s) FAILED")
        sys.exit(1)
    print("\nall checks passed")


if __name__ == "__main__":
    main()
