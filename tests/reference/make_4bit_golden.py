#!/usr/bin/env python3
"""Golden values for QLoRA's 4-bit frozen base (src/model/quant/four_bit.h): bitsandbytes' own CPU
quantize_4bit / dequantize_4bit, NF4 and FP4, with and without double quantization.

    /opt/shardlm/venv/bin/python tests/reference/make_4bit_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_4bit_golden.py --check   # compare with it

tests/golden/4bit.safetensors holds, per case (its input in.<case>, float32, bfloat16 or float16)
and quant type (nf4, fp4), what the pinned bitsandbytes (scripts/requirements.txt) returns on the CPU:
  <case>.<qt>.packed      uint8, two codes a byte (first element in the high nibble)
  <case>.<qt>.absmax      float32, one per block of 64 (no double quantization)
  <case>.<qt>.deq         dequantized, in the input's dtype;  .deq32: to float32 (small 16-bit cases)
  <case>.<qt>.dq.absmax   uint8: the absmax values minus their mean, 8-bit dynamic, blocks of 256
  <case>.<qt>.dq.absmax2  float32, one per block of 256 absmax values;  .dq.offset: their mean
  <case>.<qt>.dq.deq      dequantized through the double-quantized absmax, in the input's dtype
and map.dynamic, bitsandbytes' create_dynamic_map() (the 8-bit code of the absmax values).

The cases cover odd sizes (a partial last block, an odd element count, an odd last dimension), a
block of zeros (a full one, and a partial last one, whose absmax bitsandbytes clamps to 1e-38), tiny
values of both signs (FP4 has two zero codes), more than 256 blocks (two blocks of absmax values),
and the three input dtypes. Every block's largest magnitude is a multiple of 1/32 below 4, so the
absmax values sum exactly in float32 and their mean (torch.mean, double quantization's offset) does
not depend on the order a CPU's vector width sums them in. The shapes keep bitsandbytes' CPU
dequantize_4bit on paths that agree with each other on AVX2 and AVX-512 machines (its AVX-512 kernel
indexes absmax by row, which differs from the flat blocks when the last dimension is a multiple of
16 but not of 64; none is).
The file stores its inputs; --check reads them back and recomputes only the outputs.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "4bit.safetensors")
# name -> (shape, dtype)
CASES = {
    "f32": ((5, 77), torch.float32),     # 385 elements: 6 blocks and 1 element, odd last dimension
    "bf16": ((12, 64), torch.bfloat16),  # whole blocks, one row each
    "f16": ((3, 50), torch.float16),     # 2 blocks and a partial block of 22 zeros
    "big": ((20, 832), torch.bfloat16),  # 260 blocks: 256 absmax values and 4 more
}


def draw(shape, dtype, gen, zero_tail):
    n = shape[0] * shape[1]
    x = torch.randn(n, generator=gen)
    x[3:9] = torch.tensor([1e-4, -1e-4, 0.0, -0.0, 2e-3, -2e-3]) * float(x[:64].abs().max())
    if n > 130:
        x[64:128] = 0.0  # a full block of zeros
    if zero_tail:
        x[n - n % 64:] = 0.0  # a partial last block of zeros
    for b in range(-(-n // 64)):
        blk = x[b * 64:(b + 1) * 64]
        if float(blk.abs().max()) == 0.0:
            continue
        target = float(torch.randint(8, 128, (1,), generator=gen)) / 32  # a multiple of 1/32 in [0.25, 4)
        blk.mul_(target / blk.abs().max())
        i = int(blk.abs().argmax())
        blk[i] = target if blk[i] > 0 else -target
    return x.reshape(shape).to(dtype)


def draw_inputs():
    gen = torch.Generator().manual_seed(0)
    return {name: draw(shape, dtype, gen, name == "f16") for name, (shape, dtype) in CASES.items()}


def read_inputs():
    saved, _ = safetensors_py.load_file(OUT)
    missing = [c for c in CASES if f"in.{c}" not in saved]
    if missing:
        raise SystemExit(f"{OUT} holds no in.{missing[0]}: regenerate it by running this script without --check")
    return {c: saved[f"in.{c}"] for c in CASES}


def outputs(inputs):
    import bitsandbytes.functional as F
    store = {"map.dynamic": F.create_dynamic_map().float()}
    for case, x in inputs.items():
        store[f"in.{case}"] = x
        for qt in ("nf4", "fp4"):
            packed, st = F.quantize_4bit(x, blocksize=64, quant_type=qt)
            store[f"{case}.{qt}.packed"] = packed.reshape(-1)
            store[f"{case}.{qt}.absmax"] = st.absmax
            store[f"{case}.{qt}.deq"] = F.dequantize_4bit(packed, st)
            if x.dtype != torch.float32 and x.numel() < 1000:
                st.dtype = torch.float32
                store[f"{case}.{qt}.deq32"] = F.dequantize_4bit(packed, st)
            dq_packed, dq = F.quantize_4bit(x, blocksize=64, quant_type=qt, compress_statistics=True)
            assert torch.equal(dq_packed, packed), "double quantization changed the 4-bit codes"
            store[f"{case}.{qt}.dq.absmax"] = dq.absmax
            store[f"{case}.{qt}.dq.absmax2"] = dq.state2.absmax
            store[f"{case}.{qt}.dq.offset"] = dq.offset.reshape(1).float()
            store[f"{case}.{qt}.dq.deq"] = F.dequantize_4bit(dq_packed, dq)
    return store


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    import bitsandbytes
    store = outputs(read_inputs() if args.check else draw_inputs())
    meta = {"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__,
            "cases": {c: [list(s), str(d)] for c, (s, d) in CASES.items()}}
    safetensors_py.write_or_check({k: v.contiguous() for k, v in store.items()}, OUT,
                                  "tests/reference/make_4bit_golden.py", meta, args.check)


if __name__ == "__main__":
    main()
