#!/usr/bin/env python3
"""bf16 matrix products on this CPU against fp32 ones, measured side by side (moved here from the
unit tests, where a speed threshold failed under load).

    /opt/shardlm/venv/bin/python bench/bf16_products.py [--shardlm build/shardlm] [--repeats 5]

Trains the demo model for a few steps on 1 rank x 1 thread in fp32 and in bf16 with each
`bf16.cpu_products` setting (auto, fp32: products in fp32 rounded once, native: the library's bf16
GEMM), interleaving the repeats, and prints tokens/s (median and range of the repeats, warm-up
step dropped) and each setting's ratio to fp32, with the load average. On a CPU without bf16 dot
products `native` is the slow scalar path (~60x on an AVX2 EPYC) and `auto` should pick fp32
products; where the CPU has them (AVX-512 BF16 / AMX) `auto` is native.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tokens_per_s(shardlm, extra, steps):
    with tempfile.TemporaryDirectory() as d:
        cmd = [shardlm, "train", "--config", os.path.join(REPO, "configs", "demo.json"), f"--steps={steps}",
               "--data.val=", "--threads=1", f"--out_dir={d}", "--resume=false", *extra]
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
        with open(os.path.join(d, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    return statistics.median(r["tokens_per_s"] for r in rows[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", default=os.path.join(REPO, "build", "shardlm"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    settings = {"fp32": [], "bf16 auto": ["--bf16.enabled=true", "--bf16.cpu_products=auto"],
                "bf16 fp32 products": ["--bf16.enabled=true", "--bf16.cpu_products=fp32"],
                "bf16 native": ["--bf16.enabled=true", "--bf16.cpu_products=native"]}
    results = {k: [] for k in settings}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, extra in settings.items():
            results[name].append(tokens_per_s(args.shardlm, extra, args.steps))
    base = statistics.median(results["fp32"])
    print(f"demo model, 1 rank x 1 thread, {args.repeats} interleaved repeats; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for name, r in results.items():
        m = statistics.median(r)
        print(f"  {name:20s} {m:8.0f} tok/s (range {min(r):.0f}-{max(r):.0f})  time ratio to fp32 {base / m:.2f}")


if __name__ == "__main__":
    main()
