#!/usr/bin/env python3
"""Golden files and hf_llama.py checked against Hugging Face transformers itself.

    /opt/shardlm/venv/bin/python tests/reference/check_transformers.py

The C++ model is tested against tests/golden/, which hf_llama.py (a plain-torch
transcription of LlamaForCausalLM) generates. This script closes the loop: it
builds transformers' own LlamaForCausalLM (eager attention, float32, CPU) from
each golden config.json, loads the golden weights, runs forward + loss +
backward on the golden batch, and compares logits, loss and every parameter
gradient with (a) the stored golden values and (b) hf_llama.py on the same
weights. A rope_theta=5e5 model (golden weights, theta from the config) checks
that theta is read, and a deliberately mismatched theta must fail the bound.

Bound (norm-wise relative error, ||a - b|| / ||b||): float32 has unit roundoff
u = 2^-24 = 6e-8; this forward+backward accumulates to ~5e-7 against the exact
(float64) result (measured below, columns "*-f64", and asserted to stay under
BOUND / 4). Two float32 computations of the same math in different op order are
each within that of the exact value, so they agree to <= ~1e-6 (goldens written by
torch 1.13 vs transformers on torch 2.11: 5.5e-7 worst). BOUND = 1e-5
leaves a ~10x margin over that, yet a real semantic difference (the theta
mismatch below, a RoPE layout or GQA mapping bug in check_reference.py) moves
logits by 1e-2..1, far above it. Exits non-zero on any failure; the last line
is "N passed, M failed".
"""

import json
import os
import sys
import time

T0 = time.time()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file as st_load_file  # noqa: E402
from transformers import LlamaConfig as HFLlamaConfig  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_llama  # noqa: E402
import make_golden  # noqa: E402  (run_model: hf_llama forward + loss + backward)
import safetensors_py  # noqa: E402
from worst import worst as worst_of  # noqa: E402

BOUND = 1e-5  # see the module docstring
NOISE_MAX = BOUND / 4  # the f32-vs-f64 noise must stay well below BOUND
SENSITIVE_MIN = 100 * BOUND  # a real semantic difference must exceed BOUND by far

PASSED, FAILED = [], []


def check(cond, msg):
    print(("  ok   " if cond else "  FAIL ") + msg)
    (PASSED if cond else FAILED).append(msg)


def rel(a, b):
    """norm-wise relative error ||a - b|| / ||b||, computed in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def transformers_run(cfg_dict, weights, input_ids, targets):
    """transformers' LlamaForCausalLM: logits, loss, {param name: grad} in float32."""
    cfg = HFLlamaConfig(**cfg_dict, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = bool(cfg_dict.get("tie_word_embeddings"))
    check(list(missing) == (["lm_head.weight"] if tied else []) and not unexpected,
          f"state dict loads (missing {list(missing)}, unexpected {list(unexpected)})")
    check(model.config._attn_implementation == "eager", "eager attention")
    check(model.config.rope_parameters["rope_theta"] == cfg_dict["rope_theta"],
          f"rope_theta {model.config.rope_parameters['rope_theta']:g} read from the config")
    if tied:
        check(model.lm_head.weight is model.model.embed_tokens.weight, "lm_head shares embed_tokens.weight")
    params = dict(model.named_parameters())  # tied: lm_head.weight is not listed separately
    check(sorted(params) == sorted(weights) and all(torch.equal(params[k], weights[k]) for k in weights),
          "every transformers parameter equals the file's tensor")
    model.train(False)  # no dropout either way (attention_dropout 0); eval for good measure
    logits = model(input_ids=input_ids).logits
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))
    loss.backward()
    grads = {k: p.grad.detach() for k, p in params.items()}
    return logits.detach(), loss.detach(), grads


def compare(title, cfg_dict, weights, input_ids, targets, golden=None):
    """Table of norm-wise relative errors per tensor: transformers (tf) vs golden and vs
    hf_llama in float32 (ref), and the f32-vs-f64 noise of each against hf_llama in float64.
    (transformers itself cannot run in float64: its RMSNorm and softmax force float32.)"""
    print(f"== {title}")
    tf = transformers_run(cfg_dict, weights, input_ids, targets)
    cfg = hf_llama.LlamaConfig.from_dict(cfg_dict)
    ref = make_golden.run_model(weights, cfg, input_ids, targets, torch.float32)
    r64 = make_golden.run_model(weights, cfg, input_ids, targets, torch.float64)

    def as_dict(run):
        logits, loss, grads = run
        d = {"logits": logits, "loss": loss.reshape(1)}
        d.update(("grad." + k, g) for k, g in grads.items())
        return d

    tf, ref, r64 = as_dict(tf), as_dict(ref), as_dict(r64)
    check(sorted(tf) == sorted(ref), f"same tensors from transformers and hf_llama ({len(tf)})")
    pairs = {"tf-ref": (tf, ref), "tf-f64": (tf, r64), "ref-f64": (ref, r64)}
    if golden is not None:
        gold = {k: v for k, v in golden.items() if k not in ("input_ids", "targets")}
        gold["loss"] = gold["loss"].reshape(1)
        check(sorted(gold) == sorted(tf), f"golden file holds logits, loss and all {len(tf) - 2} grads")
        pairs = {"tf-golden": (tf, gold), **pairs, "golden-f64": (gold, r64)}
    print(f"  {'tensor':<54}" + "".join(f"{c:>12}" for c in pairs))
    worst = dict.fromkeys(pairs, 0.0)
    for k in tf:
        row = {c: rel(a[k], b[k]) for c, (a, b) in pairs.items()}
        worst = {c: worst_of(worst[c], row[c]) for c in pairs}
        print(f"  {k:<54}" + "".join(f"{row[c]:>12.2e}" for c in pairs))
    print(f"  {'worst':<54}" + "".join(f"{worst[c]:>12.2e}" for c in pairs))
    bitwise = all(torch.equal(tf[k], ref[k]) for k in tf)
    print(f"  (transformers and hf_llama bitwise identical: {bitwise})")
    if golden is not None:
        check(worst["tf-golden"] <= BOUND, f"transformers vs golden: worst {worst['tf-golden']:.2e} <= {BOUND:.0e}")
    check(worst["tf-ref"] <= BOUND, f"transformers vs hf_llama: worst {worst['tf-ref']:.2e} <= {BOUND:.0e}")
    # the same code (hf_llama) in float32 vs float64: pure rounding noise, whatever the other columns say
    noise = worst["ref-f64"]
    check(noise <= NOISE_MAX, f"f32-vs-f64 noise {noise:.2e} <= BOUND/4 = {NOISE_MAX:.1e} (bound is meaningful)")
    return tf


def main():
    torch.set_num_threads(1)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name in ("tiny", "tiny_tied"):
        gdir = os.path.join(make_golden.GOLDEN, name)
        with open(os.path.join(gdir, "config.json")) as f:
            cfg_dict = json.load(f)
        weights = st_load_file(os.path.join(gdir, "model.safetensors"))
        golden = st_load_file(os.path.join(gdir, "parity.safetensors"))
        # the golden files are written by safetensors_py; the real reader must see the same tensors
        own, _ = safetensors_py.load_file(os.path.join(gdir, "model.safetensors"))
        check(list(own) == list(weights) and all(torch.equal(own[k], weights[k]) for k in own),
              f"{name}: safetensors package and safetensors_py read identical weights")
        check(("lm_head.weight" in weights) != bool(cfg_dict["tie_word_embeddings"]),
              f"{name}: lm_head.weight in the file iff untied")
        compare(name, cfg_dict, weights, golden["input_ids"], golden["targets"], golden)

    # rope_theta read from the config: golden tiny weights and batch, theta 5e5.
    gdir = os.path.join(make_golden.GOLDEN, "tiny")
    with open(os.path.join(gdir, "config.json")) as f:
        cfg_dict = json.load(f)
    cfg_dict["rope_theta"] = 5e5
    weights = st_load_file(os.path.join(gdir, "model.safetensors"))
    batch = st_load_file(os.path.join(gdir, "parity.safetensors"))
    x, y = batch["input_ids"], batch["targets"]
    tf = compare("tiny, rope_theta 5e5 (no golden file)", cfg_dict, weights, x, y)

    print("== sensitivity: hf_llama with rope_theta 1e4 vs transformers with 5e5 must fail the bound")
    cfg_1e4 = hf_llama.LlamaConfig.from_dict(dict(cfg_dict, rope_theta=1e4))
    logits, loss, grads = make_golden.run_model(weights, cfg_1e4, x, y, torch.float32)
    d_logits = rel(logits, tf["logits"])
    d_grad = min(rel(g, tf["grad." + k]) for k, g in grads.items())
    check(d_logits > SENSITIVE_MIN, f"logits differ by {d_logits:.2e} > {SENSITIVE_MIN:.0e} (= 100 x bound)")
    print(f"  (loss differs by {rel(loss.reshape(1), tf['loss']):.2e}; least-moved gradient by {d_grad:.2e})")

    print(f"\nrun time {time.time() - T0:.1f} s")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
