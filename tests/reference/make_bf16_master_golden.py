#!/usr/bin/env python3
"""Golden values for bf16 master weights (optimizer.master_precision "bf16", src/optim/master_format.h).

    /opt/shardlm/venv/bin/python tests/reference/make_bf16_master_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_bf16_master_golden.py --check   # compare with it

The file stores its inputs (init.*, grad.*) beside the outputs; --check reads those inputs back and
recomputes only the outputs, so it does not depend on how this host's torch.randn and torch.exp round.

An independent reference of the three roundings back to bf16 after an fp32 AdamW update, over six
steps of two bf16 parameters ("w" 32x72, decayed; "b" 200, not decayed), written to
tests/golden/bf16_masters.safetensors and matched bit for bit by tests/unit/optim/test_bf16_masters.cpp:
  - kahan: torchdistx's AnyPrecisionAdamW(use_kahan_summation=True) (src/python/torchdistx/optimizers/
    anyprecision_optimizer.py): p.data.mul_(1 - lr*wd) in bf16; compensation.addcdiv_(exp_avg, denom,
    value=-step_size); temp = p.clone(); p.add_(compensation); compensation.add_(temp.sub_(p)) — every
    op on a bf16 tensor rounded to bf16 (to nearest even), here one rounding per op as torch does it.
    With fp32 moments and with bf16 moments.
  - stochastic: torchao's AdamW(bf16_stochastic_round=True) (torchao/optim/adam.py single_param_adam):
    the fp32 result goes through torchao's own _fp32_to_bf16_sr (torchao/optim/quant_utils.py), with
    torch.randint replaced by the counter-based bits of master_format.h: Philox4x32-10 written out here
    (checked against Random123's known-answer vectors), key = seed, counter = (element, step, FNV-1a of
    the name). When torchao is not installed, the same rounding written from its source is used, and
    --check still compares.
  - nearest: round to nearest even (plain bf16 training).
  - mixed: fp32 masters (mixed precision) from the same bf16 start, for the distances in the metadata.
The moment update and the fp32 step are shardlm's (torch.optim.AdamW's order: bias corrections in
double, m*b1 + (1-b1)*g, v*b2 + (1-b2)*g*g, p + (-lr/bc1) * (m / (sqrt(v)/sqrt(bc2) + eps))), written in
numpy float32 one op at a time: torch's CPU kernels fuse multiply-adds (FMA), which would make a
different last bit than the scalar C++ code, which the compiler does not contract.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "bf16_masters.safetensors")
F32, U32, U64 = np.float32, np.uint32, np.uint64
LR, B1, B2, EPS, WD, STEPS, SEED = 1e-3, 0.9, 0.95, 1e-8, 0.1, 6, 1234
SHAPES = {"w": ((32, 72), True), "b": ((200,), False)}
VARIANTS = [("kahan", "fp32"), ("kahan", "bf16"), ("stochastic", "fp32"), ("nearest", "fp32"), ("mixed", "fp32")]

# Random123's known answers for philox4x32_10 (kat_vectors): (counter, key) -> output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox(c, k):
    """Philox4x32-10 over arrays: c = 4 uint32 arrays, k = 2 ints."""
    c = [np.asarray(x, U64) & U64(0xFFFFFFFF) for x in c]
    k0, k1 = int(k[0]), int(k[1])
    for _ in range(10):
        p0, p1 = U64(0xD2511F53) * c[0], U64(0xCD9E8D57) * c[2]
        c = [(p1 >> U64(32)) ^ c[1] ^ U64(k0), p1 & U64(0xFFFFFFFF), (p0 >> U64(32)) ^ c[3] ^ U64(k1),
             p0 & U64(0xFFFFFFFF)]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return [x.astype(U32) for x in c]


def fnv1a32(s):
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def random_bits(seed, step, name, n):
    """master_format.h stochastic_bits for elements 0..n-1 of parameter `name` at optimizer step `step`."""
    e = np.arange(n, dtype=U64)
    out = philox([e & U64(0xFFFFFFFF), e >> U64(32), np.full(n, step, U64), np.full(n, fnv1a32(name), U64)],
                 (seed & 0xFFFFFFFF, seed >> 32))
    return (out[0] >> U32(16)).astype(np.int32)


def sr_from_source(x, r):
    """torchao's _fp32_to_bf16_sr, transcribed, with the random bits given."""
    bits = torch.from_numpy(x.copy()).view(torch.int32)
    toward_zero = bits & 0xFFFF0000
    bits = torch.where(torch.from_numpy(r) < (bits & 0xFFFF), toward_zero + 0x10000, toward_zero)
    return bits.view(torch.float32).bfloat16().float().numpy()


def sr_torchao(x, r):
    """torchao's own _fp32_to_bf16_sr, its torch.randint answering with the bits given."""
    from torchao.optim import quant_utils
    real = torch.randint

    def given(low, high, size, device=None, dtype=None):
        assert (low, high, tuple(size)) == (0, 1 << 16, tuple(x.shape))
        return torch.from_numpy(r.copy()).to(dtype)

    torch.randint = given
    try:
        return quant_utils._fp32_to_bf16_sr(torch.from_numpy(x.copy())).float().numpy()
    finally:
        torch.randint = real


def bf(x):
    return torch.from_numpy(np.ascontiguousarray(x, F32)).to(torch.bfloat16).float().numpy()


def reference(init, grads, rounding, moments, sr):
    out = {}
    p = {k: v.copy().reshape(-1) for k, v in init.items()}  # bf16 values held in float32
    m = {k: np.zeros(v.size, F32) for k, v in p.items()}
    v2 = {k: np.zeros(x.size, F32) for k, x in p.items()}
    c = {k: np.zeros(x.size, F32) for k, x in p.items()}
    tag = f"{rounding}.{moments}"
    for t in range(1, STEPS + 1):
        bc1, bc2 = 1 - B1 ** t, 1 - B2 ** t
        b1, omb1, b2, omb2 = F32(B1), F32(1 - B1), F32(B2), F32(1 - B2)
        bc2s, neg_step, dec, eps = F32(np.sqrt(bc2)), F32(-LR / bc1), F32(1 - LR * WD), F32(EPS)
        for k in p:
            g = grads[t - 1][k].reshape(-1)
            mk = (m[k] * b1 + omb1 * g).astype(F32)
            vk = (v2[k] * b2 + (omb2 * g) * g).astype(F32)
            update = (neg_step * (mk / (np.sqrt(vk) / bc2s + eps).astype(F32))).astype(F32)
            decay = SHAPES[k][1]
            if rounding == "kahan":
                pk = bf(p[k] * dec) if decay else p[k]                 # p.data.mul_(1 - lr * wd)
                ck = bf(c[k] + update)                                 # compensation.addcdiv_
                nxt = bf(pk + ck)                                      # p.data.add_(compensation)
                c[k] = bf(ck + bf(pk - nxt))                           # compensation.add_(temp.sub_(p))
                p[k] = nxt
            else:
                x = ((p[k] * dec).astype(F32) if decay else p[k]) + update
                x = x.astype(F32)
                if rounding == "stochastic":
                    p[k] = sr(x, random_bits(SEED, t, k, x.size))
                elif rounding == "nearest":
                    p[k] = bf(x)
                else:  # mixed: fp32 masters
                    p[k] = x
            m[k], v2[k] = (bf(mk), bf(vk)) if moments == "bf16" else (mk, vk)
            shape = init[k].shape
            out[f"{tag}.after.{t}.{k}"] = p[k].reshape(shape).copy()
            if rounding == "kahan":
                out[f"{tag}.compensation.{t}.{k}"] = c[k].reshape(shape).copy()
    return out


def draw_inputs():
    """The initial bf16 weights and the gradients, drawn when the golden is written."""
    torch.manual_seed(0)
    init = {k: bf((torch.randn(s) * 0.5).numpy()) for k, (s, _) in SHAPES.items()}
    grads = [{k: (torch.randn(s) * torch.exp(torch.randn(s)) * 1e-2).numpy() for k, (s, _) in SHAPES.items()}
             for _ in range(STEPS)]
    return init, grads


def read_inputs():
    """The inputs the committed golden was made from."""
    return safetensors_py.stored_optimizer_inputs(OUT, SHAPES, STEPS)


def build(init, grads):
    for ctr, key, expect in PHILOX_KAT:
        got = tuple(int(x[0]) for x in philox([[x] for x in ctr], key))
        assert got == expect, f"Philox4x32-10 known answer: {got} != {expect}"
    try:
        import torchao
        sr, ao = sr_torchao, torchao.__version__
        x = (np.random.default_rng(1).standard_normal(4096) * 3).astype(F32)
        r = np.random.default_rng(2).integers(0, 1 << 16, 4096).astype(np.int32)
        assert np.array_equal(sr_torchao(x, r), sr_from_source(x, r)), "torchao's rounding differs from its transcription"
    except ImportError:
        sr, ao = sr_from_source, "not installed (its rounding transcribed)"
    tensors = {}
    for k in init:
        tensors[f"init.{k}"] = init[k]
        tensors[f"random.1.{k}"] = random_bits(SEED, 1, k, init[k].size)
        for t in range(STEPS):
            tensors[f"grad.{t + 1}.{k}"] = grads[t][k]
    for rounding, moments in VARIANTS:
        tensors.update(reference(init, grads, rounding, moments, sr))
    # How far each rounding ends from fp32 masters, relative to how far fp32 masters moved (norms; for
    # Kahan also the compensated value p + c, which is what the next steps build on).
    dist = {}
    for rounding, moments in VARIANTS[:-1]:
        for k in init:
            mixed = tensors[f"mixed.fp32.after.{STEPS}.{k}"]
            got = tensors[f"{rounding}.{moments}.after.{STEPS}.{k}"]
            moved = np.linalg.norm(mixed - init[k])
            dist[f"{rounding}.{moments}.{k}"] = float(np.linalg.norm(got - mixed) / moved)
            if rounding == "kahan":
                held = got + tensors[f"{rounding}.{moments}.compensation.{STEPS}.{k}"]
                dist[f"{rounding}.{moments}.{k}.p+c"] = float(np.linalg.norm(held - mixed) / moved)
    meta = {"torch": torch.__version__, "torchao": ao, "lr": LR, "betas": [B1, B2], "eps": EPS, "weight_decay": WD,
            "steps": STEPS, "seed": SEED, "decay": {k: d for k, (_, d) in SHAPES.items()}, "distance_to_fp32": dist}
    return tensors, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    tensors, meta = build(*(read_inputs() if args.check else draw_inputs()))
    print("||p - p_fp32 masters|| / ||p_fp32 masters - p0|| after", STEPS, "steps:")
    print(json.dumps(meta["distance_to_fp32"], indent=1))
    store = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    store = {k: (v.bfloat16() if v.dtype == torch.float32 and not k.startswith(("grad.", "mixed.")) else v)
             for k, v in store.items()}
    safetensors_py.write_or_check(store, OUT, "tests/reference/make_bf16_master_golden.py", meta, args.check)


if __name__ == "__main__":
    main()
