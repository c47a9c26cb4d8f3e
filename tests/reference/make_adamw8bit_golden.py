#!/usr/bin/env python3
"""Golden values for compact optimizer states (optimizer.state_precision, src/optim/quantized_state.h).

    /opt/shardlm/venv/bin/python tests/reference/make_adamw8bit_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_adamw8bit_golden.py --check   # compare with it

Two things are written to tests/golden/adamw8bit.safetensors:
  1. An independent numpy float32 reference of bitsandbytes' AdamW8bit algorithm (block-wise dynamic
     quantization, pinned bitsandbytes 0.50.2: its dynamic maps from bitsandbytes.functional
     .create_dynamic_map, blocks of 256 counted per parameter, min_8bit_size 4096, nearest code with
     the CUDA kernel's sign rule for exp_avg), and of bf16 moments (widened, updated in float32,
     rounded to nearest even). Five steps of three parameters: 6144 elements (8-bit, decayed), 5200
     (8-bit, a partial last block, not decayed) and 100 (under min_8bit_size: fp32 moments).
  2. bitsandbytes' own AdamW8bit on the CPU over the same steps (bnb.optim.AdamW8bit, two parameter
     groups for decay / no decay). Its CPU backend picks codes through a 65536-entry lookup table
     instead of the exact nearest code (csrc/cpu_ops.cpp quantize_cpu_impl), so it differs from (1)
     by a bounded amount; the distance is printed and stored in the metadata, and the C++ test bounds
     its own distance from bitsandbytes by it.
The file stores its inputs (init.*, grad.*); --check reads them back and recomputes only the outputs,
so it does not depend on how this host's torch.randn and torch.exp round.
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
OUT = os.path.join(ROOT, "tests", "golden", "adamw8bit.safetensors")
F32 = np.float32
LR, B1, B2, EPS, WD, STEPS, BLOCK, MIN8 = 1e-2, 0.9, 0.95, 1e-8, 0.1, 5, 256, 4096
SHAPES = {"w": ((64, 96), True), "u": ((40, 130), False), "b": ((100,), True)}


def maps():
    import bitsandbytes.functional as bf
    return bf.create_dynamic_map(signed=True).numpy(), bf.create_dynamic_map(signed=False).numpy()


def quantize(x, code, signed):
    """Block-wise: absmax per 256 elements, nearest code of x/absmax (ties to the lower code)."""
    n = x.size
    nb = -(-n // BLOCK)
    absmax = np.zeros(nb, F32)
    codes = np.zeros(n, np.uint8)
    mid = ((code[:-1] + code[1:]) * F32(0.5)).astype(F32)
    zero = int(np.nonzero(code == 0)[0][0])
    for b in range(nb):
        blk = x[b * BLOCK:(b + 1) * BLOCK]
        a = F32(np.max(np.abs(blk)))
        absmax[b] = a
        if a == 0:
            codes[b * BLOCK:(b + 1) * BLOCK] = zero
            continue
        c = np.searchsorted(mid, (blk / a).astype(F32), side="left")
        if signed:
            wrong = np.signbit(code[c]) != np.signbit(blk)
            c = np.where(wrong, np.where(blk > 0, c + 1, c - 1), c)
        codes[b * BLOCK:(b + 1) * BLOCK] = c
    return codes, absmax


def dequantize(codes, absmax, code):
    return (code[codes] * np.repeat(absmax, BLOCK)[:codes.size]).astype(F32)


def to_bf16(x):
    return torch.from_numpy(x).to(torch.bfloat16).float().numpy()


def reference(init, grads, precision, code_s, code_u):
    """The update of src/optim/adamw.cpp step_compact, in numpy float32, op for op."""
    out = {}
    p = {k: v.copy().reshape(-1) for k, v in init.items()}
    eight = {k: precision == "8bit" and p[k].size >= MIN8 for k in p}
    st = {}
    for k in p:
        n = p[k].size
        if eight[k]:
            st[k] = [np.full(n, int(np.nonzero(code_s == 0)[0][0]), np.uint8), np.zeros(-(-n // BLOCK), F32),
                     np.full(n, int(np.nonzero(code_u == 0)[0][0]), np.uint8), np.zeros(-(-n // BLOCK), F32)]
        else:
            st[k] = [np.zeros(n, F32), None, np.zeros(n, F32), None]
    for t in range(1, STEPS + 1):
        bc1 = 1 - B1 ** t
        bc2 = 1 - B2 ** t
        b1, omb1, b2, omb2 = F32(B1), F32(1 - B1), F32(B2), F32(1 - B2)
        bc2s, neg_step, dec, eps = F32(np.sqrt(bc2)), F32(-LR / bc1), F32(1 - LR * WD), F32(EPS)
        for k in p:
            g = grads[t - 1][k].reshape(-1)
            if eight[k]:
                m = dequantize(st[k][0], st[k][1], code_s)
                v = dequantize(st[k][2], st[k][3], code_u)
            elif precision == "bf16":
                m, v = st[k][0].astype(F32), st[k][2].astype(F32)
            else:
                m, v = st[k][0], st[k][2]
            m = (m * b1 + omb1 * g).astype(F32)
            v = (v * b2 + (omb2 * g) * g).astype(F32)
            pk = p[k]
            if SHAPES[k][1]:
                pk = (pk * dec).astype(F32)
            denom = (np.sqrt(v) / bc2s + eps).astype(F32)
            p[k] = (pk + neg_step * (m / denom)).astype(F32)
            if eight[k]:
                st[k][0], st[k][1] = quantize(m, code_s, True)
                st[k][2], st[k][3] = quantize(v, code_u, False)
            elif precision == "bf16":
                st[k][0], st[k][2] = to_bf16(m), to_bf16(v)
            else:
                st[k][0], st[k][2] = m, v
            out[f"{precision}.after.{t}.{k}"] = p[k].reshape(init[k].shape).copy()
            if eight[k]:
                out[f"{precision}.codes1.{t}.{k}"] = st[k][0].copy()
                out[f"{precision}.absmax1.{t}.{k}"] = st[k][1].copy()
                out[f"{precision}.codes2.{t}.{k}"] = st[k][2].copy()
                out[f"{precision}.absmax2.{t}.{k}"] = st[k][3].copy()
            elif precision == "bf16":
                out[f"{precision}.exp_avg.{t}.{k}"] = st[k][0].copy()
    return out


def run_bnb(init, grads):
    import bitsandbytes as bnb
    ps = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in init.items()}
    opt = bnb.optim.AdamW8bit([{"params": [ps[k] for k in ps if SHAPES[k][1]], "weight_decay": WD},
                               {"params": [ps[k] for k in ps if not SHAPES[k][1]], "weight_decay": 0.0}],
                              lr=LR, betas=(B1, B2), eps=EPS)
    out = {}
    for t in range(1, STEPS + 1):
        for k in ps:
            ps[k].grad = torch.from_numpy(grads[t - 1][k].copy())
        opt.step()
        for k in ps:
            out[f"bnb.after.{t}.{k}"] = ps[k].detach().numpy().copy()
    return out, bnb.__version__


def draw_inputs():
    """The initial weights and the gradients, drawn when the golden is written."""
    torch.manual_seed(0)
    init = {k: (torch.randn(s) * 0.5).numpy() for k, (s, _) in SHAPES.items()}
    grads = []
    for t in range(STEPS):
        step = {}
        for k, (s, _) in SHAPES.items():
            # Magnitudes spread (log-normal) inside each block, and a block of zero gradients.
            g = torch.randn(s) * torch.exp(torch.randn(s) * 0.5) * 1e-2
            if k == "w":
                g.view(-1)[512:768] = 0.0
                # Tiny values beside normal ones: their nearest exp_avg code is 0, and the sign rule
                # moves the negative ones to the smallest negative code.
                g.view(-1)[1024:1040] = torch.tensor([1e-12, -1e-12] * 8)
            step[k] = g.numpy()
        grads.append(step)
    return init, grads


def read_inputs():
    """The inputs the committed golden was made from."""
    return safetensors_py.stored_optimizer_inputs(OUT, SHAPES, STEPS)


def build(init, grads):
    code_s, code_u = maps()
    tensors = {"map.signed": code_s, "map.unsigned": code_u}
    for k in init:
        tensors[f"init.{k}"] = init[k]
        for t in range(STEPS):
            tensors[f"grad.{t + 1}.{k}"] = grads[t][k]
    for precision in ("8bit", "bf16", "fp32"):
        tensors.update(reference(init, grads, precision, code_s, code_u))
    bnb_out, version = run_bnb(init, grads)
    tensors.update(bnb_out)
    # The distance of bitsandbytes' CPU AdamW8bit from the reference, per step, relative to the
    # largest change of the parameter from its initial value.
    dist = {}
    for t in range(1, STEPS + 1):
        for k in init:
            ref, got = tensors[f"8bit.after.{t}.{k}"], tensors[f"bnb.after.{t}.{k}"]
            moved = float(np.max(np.abs(ref - init[k])))
            dist[f"{t}.{k}"] = float(np.max(np.abs(ref - got))) / moved
    meta = {"bitsandbytes": version, "torch": torch.__version__, "lr": LR, "betas": [B1, B2], "eps": EPS,
            "weight_decay": WD, "steps": STEPS, "decay": {k: d for k, (_, d) in SHAPES.items()},
            "bnb_distance": dist}
    return tensors, meta


def print_maps():
    import re
    def literal(v):
        m = re.match(r"(-?0x[01])\.?([0-9a-f]*)p([+-]\d+)", float(v).hex())
        mantissa = m.group(2).rstrip("0")
        return f"{m.group(1)}{'.' + mantissa if mantissa else ''}p{m.group(3)}f"
    for name, code in zip(("kSignedMap", "kUnsignedMap"), maps()):
        print(f"constexpr std::array<float, 256> {name} = {{")
        line = "   "
        for v in (literal(x) for x in code.tolist()):
            if len(line) + len(v) + 2 > 116:
                print(line.rstrip())
                line = "   "
            line += " " + v + ","
        print(line.rstrip())
        print("};")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--print-maps", action="store_true",
                    help="print the dynamic maps as the C++ arrays of src/model/quant/dynamic_map.cpp")
    args = ap.parse_args()
    if args.print_maps:
        print_maps()
        return
    tensors, meta = build(*(read_inputs() if args.check else draw_inputs()))
    print("bitsandbytes CPU AdamW8bit vs the reference, max |diff| / max |p - p0|:")
    print(json.dumps(meta["bnb_distance"], indent=1))
    if args.check:
        saved, _ = safetensors_py.load_file(OUT)
        bad = [k for k in tensors if k not in saved or not np.array_equal(saved[k].numpy(), tensors[k])]
        if bad:
            sys.exit(f"{OUT} differs from what the script makes: {bad[:5]}")
        print("golden matches")
        return
    safetensors_py.save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, OUT,
                             {"made_by": "tests/reference/make_adamw8bit_golden.py", "meta": json.dumps(meta)})
    print("wrote", OUT)


if __name__ == "__main__":
    main()
