#!/usr/bin/env python3
"""Regenerate every file under tests/golden/ deterministically.

    /opt/shardlm/venv/bin/python tests/reference/make_golden.py           # (re)write tests/golden/
    /opt/shardlm/venv/bin/python tests/reference/make_golden.py --check   # recompute in memory
                                                                          # and compare byte-for-byte

The files store their inputs (the weights in model.safetensors, input_ids/targets in
parity.safetensors, init.*/grad.* in adamw.safetensors); --check reads those back and recomputes
only the outputs, never drawing the inputs again on the host at hand.

Run it with the pinned environment's python ($SHARDLM_VENV, default /opt/shardlm/venv,
installed by scripts/setup.sh): the bytes depend on the torch version (float32 rounding
order of its CPU kernels), so --check is exact only with the torch that wrote the files
(recorded in each file's metadata and in tests/golden/README.md). Only torch + numpy are
used here; check_transformers.py compares the results with transformers itself.

Golden values are computed in float32 exactly as HF transformers does (see
hf_llama.py). As a meaningfulness check every model result is recomputed in
float64 from the same (float32-valued) weights and inputs, and the f32-vs-f64
discrepancy is reported (and recorded in tests/golden/README.md), so one can see
that a 1e-5 relative tolerance is well above float32 noise.
"""

import argparse
import hashlib
import json
import os
import sys
from collections import OrderedDict


def _cpu_has_avx2():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx2" in line.split() for line in f)
    except OSError:
        return False


# Pin the CPU code paths before torch loads: torch picks its vectorized kernels (even those of
# torch.randn, which draws the weights) and MKL its GEMM per instruction set, and they round
# differently (ATEN_CPU_CAPABILITY=default changes every file), so the bytes would depend on
# the CPU. The checked-in files use AVX2 for both; any x86-64 CPU since ~2013 has it. Only where the CPU has it: torch trusts the variable (SIGILL otherwise).
# (check_reference.py imports this module before torch for the same reason.)
if _cpu_has_avx2():
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    # STRICT: without it MKL still takes other code paths on some AVX-512 CPUs (measured on a
    # Sapphire Rapids Xeon: logits differed from the checked-in files by ~5e-8 with plain AVX2).
    os.environ["MKL_CBWR"] = "AVX2,STRICT"

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_llama  # noqa: E402
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "tests", "golden")
SCRIPT = "tests/reference/make_golden.py"
REGEN_CMD = "/opt/shardlm/venv/bin/python tests/reference/make_golden.py"

WEIGHT_SEED = 0
INPUT_SEED = 1
ADAMW_SEED = 2
BATCH, SEQ = 2, 16
RTOL = 1e-5  # the tolerance the C++ tests use

TINY_CONFIG = OrderedDict(
    [
        ("architectures", ["LlamaForCausalLM"]),
        ("model_type", "llama"),
        ("vocab_size", 128),
        ("hidden_size", 64),
        ("intermediate_size", 176),
        ("num_hidden_layers", 2),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("max_position_embeddings", 128),
        ("rms_norm_eps", 1e-5),
        ("rope_theta", 10000.0),
        ("tie_word_embeddings", False),
        ("hidden_act", "silu"),
        ("initializer_range", 0.02),
        ("torch_dtype", "float32"),
        ("attention_bias", False),
        ("bos_token_id", 1),
        ("eos_token_id", 2),
    ]
)

# AdamW golden
ADAMW_STEPS = 6
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
ADAMW_WD = 0.1
ADAMW_MAX_NORM = 1.0
# per-step gradient scale: the raw grad norm is roughly 3.9 * scale, so steps
# 2 and 4 (0-based) are clipped; asserted below with a margin.
ADAMW_GRAD_SCALES = [0.1, 0.2, 2.0, 0.05, 1.5, 0.15]


HF_NOTES = [
    "RMSNorm: `x32 = x.float(); x32 * rsqrt(mean(x32^2, -1) + eps)`, cast back to the input dtype, "
    "*then* multiply by weight. eps is inside the rsqrt (eps=1e-5 is ~2.5% of the mean square here, "
    "so placement is visible).",
    "RoPE: `inv_freq = 1 / theta ** (arange(0, D, 2).float() / D)` in float32; angle = pos * inv_freq[j] "
    "(float32); `emb = cat(freqs, freqs)` (NOT interleaved); cos/sin computed in float32 then cast to "
    "the activation dtype; `q*cos + rotate_half(q)*sin` with rotate_half([x1, x2]) = [-x2, x1]. "
    "HF checkpoints already have q/k rows permuted for this layout: never un-permute.",
    "RoPE is applied to q and k after splitting heads (per head, over head_dim), before repeat_kv. "
    "Position ids default to 0..T-1 for every row.",
    "q_proj output feature h*D + d is head h, dim d (view(B, T, nH, D)); same for k/v with nKV heads.",
    "GQA: query head h uses kv head h // (nH/nKV) (repeat_kv == repeat_interleave on the head dim).",
    "Scores: `(q @ k^T) / sqrt(head_dim)` (scaling after the matmul; transformers 5 multiplies by "
    "head_dim**-0.5, the same value for head_dim 16), plus an additive causal mask of "
    "finfo(dtype).min (not -inf) above the diagonal; softmax over keys in float32 "
    "(`dtype=torch.float32`), then cast back to q's dtype before `@ v`. No dropout.",
    "Attention output: transpose back to [B, T, nH, D], reshape to [B, T, nH*D], o_proj.",
    "MLP: `down(silu(gate(x)) * up(x))`; silu(x) = x * sigmoid(x). No biases anywhere.",
    "Decoder layer: `h = h + attn(input_layernorm(h)); h = h + mlp(post_attention_layernorm(h))`; "
    "final `model.norm`, then lm_head; no embedding scaling.",
    "Tied: lm_head uses model.embed_tokens.weight (same tensor); the file has no lm_head.weight and "
    "the embedding gradient is lookup-grad + head-grad.",
    "Logits are upcast `.float()` before the loss; loss = mean CE over all B*T targets "
    "(F.cross_entropy default ignore_index=-100 excludes those from sum and count).",
    "nn.Embedding is built with padding_idx = config.pad_token_id: if a config sets pad_token_id, "
    "that row's gradient is always zero (tiny configs here have none).",
    "clip_grad_norm_: clip coefficient max_norm / (total_norm + 1e-6), clamped to <= 1; returns the "
    "pre-clip norm.",
]

def adamw_lr(k):
    return 1e-2 * (k + 1) / ADAMW_STEPS


# --------------------------------------------------------------------------- #
def init_params(cfg, seed=WEIGHT_SEED):
    """Seeded float32 weights, drawn in HF named_parameters() order.

    Linear / embedding: N(0, 0.02), except q_proj/k_proj: N(0, 0.08) so that
    attention is far from uniform. RMSNorm weights: 1 + 0.1 * N(0, 1) so that a
    bug ignoring the norm weight is visible. (lm_head is drawn last, so the
    tied and untied variants share every other tensor.)
    """
    gen = torch.Generator().manual_seed(seed)
    params = OrderedDict()
    for name, shape in hf_llama.param_shapes(cfg).items():
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if len(shape) == 1:
            x = 1.0 + 0.1 * x
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            x = 0.08 * x
        else:
            x = 0.02 * x
        params[name] = x
    return params


def make_batch(cfg, seed=INPUT_SEED):
    """input_ids and (already shifted) targets from one random stream of T+1 tokens."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, cfg.vocab_size, (BATCH, SEQ + 1), generator=gen, dtype=torch.int64)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def run_model(params, cfg, input_ids, targets, dtype):
    """forward + loss + backward in `dtype`; returns logits, loss, grads (detached)."""
    leaves = OrderedDict(
        (k, v.detach().to(dtype).clone().requires_grad_(True)) for k, v in params.items()
    )
    logits = hf_llama.forward(leaves, cfg, input_ids)
    loss = hf_llama.loss_fn(logits, targets)
    loss.backward()
    grads = OrderedDict((k, v.grad.detach()) for k, v in leaves.items())
    return logits.detach(), loss.detach(), grads


def err_stats(x32, x64):
    """Discrepancy of a float32 result against its float64 recomputation."""
    a = x32.double()
    b = x64.double()
    diff = (a - b).abs()
    max_ref = b.abs().max().item()
    # smallest atol with |a-b| <= atol + RTOL*|b| everywhere
    need_atol = (diff - RTOL * b.abs()).clamp(min=0).max().item()
    big = b.abs() > 1e-3 * max_ref  # elementwise relative error, ignoring near-zeros
    max_rel_elem = (diff[big] / b.abs()[big]).max().item() if big.any() else 0.0
    return dict(
        max_abs=diff.max().item(),
        max_ref=max_ref,
        rel_to_max=diff.max().item() / max_ref if max_ref > 0 else 0.0,
        rel_norm=(diff.norm() / b.norm()).item() if b.norm() > 0 else 0.0,
        max_rel_elem=max_rel_elem,
        need_atol_at_rtol=need_atol,
    )


def fmt_stats(s):
    return (
        f"max|d|={s['max_abs']:.3e} max|ref|={s['max_ref']:.3e} "
        f"max|d|/max|ref|={s['rel_to_max']:.3e} |d|/|ref|={s['rel_norm']:.3e} "
        f"max_elem_rel={s['max_rel_elem']:.3e} atol_needed@rtol1e-5={s['need_atol_at_rtol']:.3e}"
    )


def common_metadata(what):
    return OrderedDict(
        [
            ("generator", SCRIPT),
            ("regenerate", REGEN_CMD),
            ("torch_version", torch.__version__),
            ("contents", what),
        ]
    )


# --------------------------------------------------------------------------- #
def stored_model_inputs(name, cfg):
    """The weights and the batch the committed tests/golden/<name>/ files were made from."""
    weights, _ = safetensors_py.load_file(os.path.join(GOLDEN, name, "model.safetensors"))
    parity, _ = safetensors_py.load_file(os.path.join(GOLDEN, name, "parity.safetensors"))
    params = OrderedDict((k, weights[k]) for k in hf_llama.param_shapes(cfg))
    return params, parity["input_ids"], parity["targets"]


def build_model_golden(name, tie, stored):
    """Returns (files: dict relpath -> bytes, report: dict). stored: take the inputs from the committed
    files instead of drawing them."""
    cfg_dict = OrderedDict(TINY_CONFIG)
    cfg_dict["tie_word_embeddings"] = tie
    cfg = hf_llama.LlamaConfig.from_dict(dict(cfg_dict))
    if stored:
        params, input_ids, targets = stored_model_inputs(name, cfg)
    else:
        params = init_params(cfg)
        input_ids, targets = make_batch(cfg)

    logits, loss, grads = run_model(params, cfg, input_ids, targets, torch.float32)
    logits64, loss64, grads64 = run_model(params, cfg, input_ids, targets, torch.float64)

    stats = OrderedDict()
    stats["logits"] = err_stats(logits, logits64)
    stats["loss"] = err_stats(loss.reshape(1), loss64.reshape(1))
    for k in grads:
        stats["grad." + k] = err_stats(grads[k], grads64[k])

    files = OrderedDict()
    files[f"{name}/config.json"] = (json.dumps(cfg_dict, indent=2) + "\n").encode()

    md = common_metadata(
        f"{name}: seeded float32 weights (seed {WEIGHT_SEED}) for the config.json next to this file; "
        "HF parameter names, Linear weights [out, in]"
        + ("; tied: no lm_head.weight" if tie else "")
    )
    md["format"] = "pt"
    files[f"{name}/model.safetensors"] = safetensors_py.serialize(params, md)

    parity = OrderedDict()
    parity["input_ids"] = input_ids
    parity["targets"] = targets
    parity["logits"] = logits.float()
    parity["loss"] = loss.float().reshape(())
    for k, g in grads.items():
        parity["grad." + k] = g.float()
    pmd = common_metadata(
        f"{name}: forward/backward of hf_llama.py (HF LlamaForCausalLM math) in float32 on "
        f"model.safetensors; input_ids/targets from seed {INPUT_SEED} (targets = next tokens, "
        "already shifted); loss = mean cross-entropy over all B*T tokens; grad.<name> = dloss/dparam"
    )
    pmd["loss_f64"] = repr(loss64.item())
    pmd["max_rel_norm_err_f32_vs_f64"] = "%.3e" % max(s["rel_norm"] for s in stats.values())
    files[f"{name}/parity.safetensors"] = safetensors_py.serialize(parity, pmd)

    report = dict(
        name=name,
        loss=loss.item(),
        loss64=loss64.item(),
        stats=stats,
        n_params=sum(p.numel() for p in params.values()),
    )
    return files, report


def adamw_inputs(stored):
    """init_w, init_b and the raw gradients: drawn, or (stored) read from the committed adamw.safetensors."""
    if stored:
        t, _ = safetensors_py.load_file(os.path.join(GOLDEN, "adamw.safetensors"))
        return t["init.w"], t["init.b"], [(t[f"grad.{k}.w"], t[f"grad.{k}.b"]) for k in range(ADAMW_STEPS)]
    gen = torch.Generator().manual_seed(ADAMW_SEED)
    init_w = torch.randn(4, 3, generator=gen, dtype=torch.float32)
    init_b = torch.randn(3, generator=gen, dtype=torch.float32)
    raw_grads = []
    for k in range(ADAMW_STEPS):
        gw = torch.randn(4, 3, generator=gen, dtype=torch.float32) * ADAMW_GRAD_SCALES[k]
        gb = torch.randn(3, generator=gen, dtype=torch.float32) * ADAMW_GRAD_SCALES[k]
        raw_grads.append((gw, gb))
    return init_w, init_b, raw_grads


def _adamw_run(dtype, inputs):
    init_w, init_b, raw_grads = inputs
    w = init_w.to(dtype).clone().requires_grad_(True)
    b = init_b.to(dtype).clone().requires_grad_(True)
    # A trainer applying "weight decay only on tensors with 2+ dims".
    decay = [p for p in (w, b) if p.dim() >= 2]
    no_decay = [p for p in (w, b) if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": ADAMW_WD},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=adamw_lr(0),
        betas=ADAMW_BETAS,
        eps=ADAMW_EPS,
        weight_decay=ADAMW_WD,
    )
    out = OrderedDict()
    out["init.w"] = init_w
    out["init.b"] = init_b
    lrs, norms, clipped, after = [], [], [], []
    for k in range(ADAMW_STEPS):
        gw, gb = raw_grads[k]
        w.grad = gw.to(dtype).clone()
        b.grad = gb.to(dtype).clone()
        total_norm = torch.nn.utils.clip_grad_norm_([w, b], max_norm=ADAMW_MAX_NORM)
        norms.append(total_norm.item())
        clipped.append((w.grad.detach().clone(), b.grad.detach().clone()))
        for group in opt.param_groups:
            group["lr"] = adamw_lr(k)
        lrs.append(adamw_lr(k))
        opt.step()
        after.append((w.detach().clone(), b.detach().clone()))
    return init_w, init_b, raw_grads, lrs, norms, clipped, after


def build_adamw_golden(stored):
    inputs = adamw_inputs(stored)
    init_w, init_b, raw_grads, lrs, norms, clipped, after = _adamw_run(torch.float32, inputs)
    _, _, _, _, norms64, clipped64, after64 = _adamw_run(torch.float64, inputs)

    n_clipped = sum(n > ADAMW_MAX_NORM for n in norms)
    assert 0 < n_clipped < ADAMW_STEPS, norms
    assert all(abs(n - ADAMW_MAX_NORM) > 0.2 for n in norms), norms  # no borderline steps

    t = OrderedDict()
    t["init.w"] = init_w
    t["init.b"] = init_b
    for k in range(ADAMW_STEPS):
        t[f"grad.{k}.w"] = raw_grads[k][0]
        t[f"grad.{k}.b"] = raw_grads[k][1]
    t["lr"] = torch.tensor(lrs, dtype=torch.float32)
    t["total_norm"] = torch.tensor(norms, dtype=torch.float32)
    for k in range(ADAMW_STEPS):
        t[f"clipped_grad.{k}.w"] = clipped[k][0].float()
        t[f"clipped_grad.{k}.b"] = clipped[k][1].float()
    for k in range(ADAMW_STEPS):
        t[f"after.{k}.w"] = after[k][0].float()
        t[f"after.{k}.b"] = after[k][1].float()

    md = common_metadata(
        "torch.optim.AdamW golden: params w [4,3] (weight_decay 0.1) and b [3] (weight_decay 0.0, "
        "1-dim); for each step k: p.grad = grad.{k}.*; total_norm[k] = clip_grad_norm_([w, b], "
        "max_norm=1.0) (returned pre-clip norm); clipped_grad.{k}.* = grads after clipping; every "
        "group's lr = lr[k]; opt.step(); after.{k}.* = params after the step"
    )
    md["betas"] = json.dumps(list(ADAMW_BETAS))
    md["eps"] = repr(ADAMW_EPS)
    md["weight_decay_w"] = repr(ADAMW_WD)
    md["weight_decay_b"] = "0.0"
    md["max_norm"] = repr(ADAMW_MAX_NORM)
    md["lr_formula"] = "lr[k] = 1e-2 * (k + 1) / 6, k = 0..5 (Python double; stored as F32)"
    md["steps"] = str(ADAMW_STEPS)

    stats = OrderedDict()
    stats["total_norm"] = err_stats(torch.tensor(norms), torch.tensor(norms64, dtype=torch.float64))
    for k in range(ADAMW_STEPS):
        stats[f"after.{k}.w"] = err_stats(after[k][0], after64[k][0])
        stats[f"after.{k}.b"] = err_stats(after[k][1], after64[k][1])
    report = dict(norms=norms, lrs=lrs, n_clipped=n_clipped, stats=stats)
    return {"adamw.safetensors": safetensors_py.serialize(t, md)}, report


# --------------------------------------------------------------------------- #
def readme(reports, adamw_report, files):
    lines = []
    w = lines.append
    w("# Golden files for the shardlm C++ tests")
    w("")
    w("Generated by `%s` (torch %s, CPU, float32, 1 thread), run with the python of the pinned" % (
        SCRIPT, torch.__version__))
    w("virtual environment (`$SHARDLM_VENV`, default `/opt/shardlm/venv`, installed by `scripts/setup.sh`).")
    w("The script pins torch's and MKL's CPU code paths to AVX2 (`ATEN_CPU_CAPABILITY=avx2`, `MKL_CBWR=AVX2,STRICT`),")
    w("so `--check` is byte-exact with this torch version on any AVX2 x86-64 CPU; with another torch the")
    w("float32 rounding differs (~5e-7 norm-wise relative) and the files must be regenerated.")
    w("Do not edit by hand. Regenerate with:")
    w("")
    w("    %s" % REGEN_CMD)
    w("")
    w("and verify that the checked-in files are what the script produces with:")
    w("")
    w("    %s --check" % REGEN_CMD)
    w("")
    w("The model math is `tests/reference/hf_llama.py`, a plain-torch transcription of")
    w("Hugging Face transformers' `LlamaForCausalLM` (eager attention). `tests/reference/check_transformers.py`")
    w("runs transformers' own model on these files and compares logits, loss and every gradient")
    w("(norm-wise relative error <= 1e-5; measured ~5e-7, the float32 noise).")
    w("The `.safetensors` files are written by `tests/reference/safetensors_py.py`")
    w("(standard safetensors layout; every file has a `__metadata__` block that repeats")
    w("what it holds and how it was made). Sanity checks of the transcription:")
    w("`/opt/shardlm/venv/bin/python tests/reference/check_reference.py`.")
    w("")
    w("## Files")
    w("")
    w("| file | contents |")
    w("|---|---|")
    w("| `tiny/config.json` | HF-style config: V=128, H=64, I=176, 2 layers, 4 heads, 2 KV heads (GQA, head_dim 16), rms_norm_eps 1e-5, rope_theta 1e4, untied |")
    w("| `tiny/model.safetensors` | F32 weights, HF names, Linear weights `[out, in]`; seed %d: N(0,0.02), q/k_proj N(0,0.08), norm weights 1+0.1·N(0,1) |" % WEIGHT_SEED)
    w("| `tiny/parity.safetensors` | `input_ids` I64 [2,16], `targets` I64 [2,16] (already shifted), `logits` F32 [2,16,128], `loss` F32 [] (mean CE over all 32 tokens), `grad.<param name>` F32 for every parameter |")
    w("| `tiny_tied/…` | same, `tie_word_embeddings: true`; no `lm_head.weight` in the model file; `grad.model.embed_tokens.weight` includes the LM-head contribution. All other weights and the batch are identical to `tiny/` |")
    w("| `adamw.safetensors` | torch.optim.AdamW trajectory, see below |")
    w("")
    w("Loss convention: `loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))`,")
    w("with `input_ids = seq[:, :-1]`, `targets = seq[:, 1:]` for a random `seq` of 17 tokens per row.")
    w("")
    w("## Values")
    w("")
    for r in reports:
        w("- `%s/` loss (f32, stored) = %.9g; float64 recomputation = %.12g" % (r["name"], r["loss"], r["loss64"]))
    w("")
    w("## Float32 vs float64 (is a 1e-5 relative tolerance meaningful?)")
    w("")
    w("Each model result was recomputed in float64 from the same weights/inputs. Columns: max abs")
    w("error; max abs reference value; their ratio (error relative to the tensor's scale); norm-wise")
    w("relative error `||f32 - f64|| / ||f64||`; and the smallest atol such that")
    w("`|f32 - f64| <= atol + 1e-5 * |f64|` holds elementwise (pure rtol=1e-5 fails on near-zero entries).")
    w("")
    for r in reports:
        w("### %s" % r["name"])
        w("")
        w("| tensor | max abs err | max abs ref | err / max ref | norm rel | atol needed at rtol=1e-5 |")
        w("|---|---|---|---|---|---|")
        for k, s in r["stats"].items():
            w("| %s | %.2e | %.2e | %.2e | %.2e | %.2e |" % (
                k, s["max_abs"], s["max_ref"], s["rel_to_max"], s["rel_norm"], s["need_atol_at_rtol"]))
        w("")
    w("Suggested comparison: `|cpp - golden| <= 1e-5 * |golden| + 1e-5 * max|golden|` per tensor")
    w("(or norm-wise relative error <= 1e-5). A pure elementwise rtol fails on near-zero entries")
    w("even for float64-vs-float32; f32 rounding noise is ~5e-7 of the tensor scale.")
    w("")
    w("## HF semantics the C++ model must reproduce (see hf_llama.py)")
    w("")
    for line in HF_NOTES:
        w("- " + line)
    w("")
    w("What the goldens distinguish (relative change of logits, from check_reference.py): interleaved")
    w("RoPE 1.2e-1, no RoPE 1.3e-1, rope_theta 5e5 1.0e-1, GQA head h%nKV 9.9e-1, RMSNorm eps outside")
    w("sqrt 1.5e-2, norm weight ignored 1.7e-1, no causal mask 8.2e-1, silu on up 7.7e-2. Not caught:")
    w("a constant offset of all position ids (RoPE is relative). The loss alone moves much less")
    w("(1e-5..1e-2 relative) -- compare logits and grads, not only the loss.")
    w("")
    w("## adamw.safetensors")
    w("")
    w("Two params: `w` [4,3] in a group with weight_decay 0.1, `b` [3] in a group with weight_decay 0.0")
    w("(\"decay only tensors with >= 2 dims\"). betas (0.9, 0.95), eps 1e-8. For step k = 0..5:")
    w("")
    w("1. `w.grad = grad.{k}.w`, `b.grad = grad.{k}.b` (raw, pre-clip)")
    w("2. `total_norm[k] = clip_grad_norm_([w, b], max_norm=1.0)` — returns the *pre-clip* global L2 norm;")
    w("   grads are multiplied by `min(1, 1.0 / (total_norm + 1e-6))` (note the 1e-6). `clipped_grad.{k}.*`")
    w("   holds the grads after clipping.")
    w("3. every group's `lr = lr[k]` where `lr[k] = 1e-2 * (k+1) / 6` (stored F32; compute it in double)")
    w("4. `opt.step()`; `after.{k}.*` = params after the step.")
    w("")
    w("total_norm = %s; clipped on %d of %d steps." % (
        ", ".join("%.6g" % n for n in adamw_report["norms"]), adamw_report["n_clipped"], ADAMW_STEPS))
    w("")
    w("torch AdamW step (single-tensor path, step counter t starts at 1):")
    w("")
    w("    p *= 1 - lr * weight_decay            # decoupled decay, before the moments")
    w("    m = beta1 * m + (1 - beta1) * g")
    w("    v = beta2 * v + (1 - beta2) * g * g")
    w("    denom = sqrt(v) / sqrt(1 - beta2**t) + eps")
    w("    p -= (lr / (1 - beta1**t)) * m / denom")
    w("")
    w("Max f32-vs-f64 norm-relative error over all `after.*`: %.2e." % max(
        s["rel_norm"] for k, s in adamw_report["stats"].items() if k.startswith("after")))
    w("")
    w("## SHA-256")
    w("")
    for rel in sorted(files):
        w("- `%s` %s" % (rel, hashlib.sha256(files[rel]).hexdigest()))
    w("")
    return ("\n".join(lines)).encode()


def build_all(stored):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    files = OrderedDict()
    reports = []
    for name, tie in (("tiny", False), ("tiny_tied", True)):
        f, r = build_model_golden(name, tie, stored)
        files.update(f)
        reports.append(r)
    f, adamw_report = build_adamw_golden(stored)
    files.update(f)
    files["README.md"] = readme(reports, adamw_report, files)
    return files, reports, adamw_report


def print_report(reports, adamw_report):
    for r in reports:
        print(f"== {r['name']}: {r['n_params']} params")
        print(f"   loss f32 = {r['loss']!r}   loss f64 = {r['loss64']!r}")
        worst = max(r["stats"].items(), key=lambda kv: kv[1]["rel_norm"])
        worst_atol = max(r["stats"].items(), key=lambda kv: kv[1]["need_atol_at_rtol"])
        print(f"   logits: {fmt_stats(r['stats']['logits'])}")
        print(f"   loss:   {fmt_stats(r['stats']['loss'])}")
        print(f"   worst norm-rel tensor {worst[0]}: {fmt_stats(worst[1])}")
        print(f"   worst atol tensor {worst_atol[0]}: {fmt_stats(worst_atol[1])}")
    print("== adamw")
    print("   total_norm:", ["%.6g" % n for n in adamw_report["norms"]], "clipped:", adamw_report["n_clipped"])
    print("   lr:", ["%.6g" % x for x in adamw_report["lrs"]])
    worst = max(adamw_report["stats"].items(), key=lambda kv: kv[1]["rel_norm"])
    print(f"   worst f32-vs-f64 {worst[0]}: {fmt_stats(worst[1])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with files on disk, write nothing")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    files, reports, adamw_report = build_all(stored=args.check)
    if not args.quiet:
        print_report(reports, adamw_report)

    if args.check:
        bad = []
        for rel, data in files.items():
            path = os.path.join(GOLDEN, rel)
            if not os.path.exists(path):
                bad.append(rel + " (missing)")
            elif open(path, "rb").read() != data:
                bad.append(rel + " (differs)")
        if bad:
            print("golden files out of date:", *bad, sep="\n  ")
            made_with = safetensors_py.load_file(os.path.join(GOLDEN, "adamw.safetensors"))[1].get("torch_version")
            print("(checked-in files: torch %s, CPU capability AVX2; this run: torch %s, %s)" % (
                made_with, torch.__version__, torch.backends.cpu.get_cpu_capability()))
            sys.exit(1)
        print("golden files up to date (%d files)" % len(files))
        return

    for rel, data in files.items():
        path = os.path.join(GOLDEN, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print("wrote", os.path.relpath(path, ROOT), len(data), "bytes")


if __name__ == "__main__":
    main()
