#!/usr/bin/env python3
"""Record and compare `shardlm plan` outputs over a fixed matrix of invocations.

Why this file exists: the planner (src/plan/) is restructured from time to time - split into files,
helpers shared, loops reordered - and such a change must not move a single number. This script
runs one fixed matrix of `shardlm plan` invocations (presets and Hugging Face config.json files;
devices, tensor/pipeline sizes, ZeRO stages, precisions, recompute modes, attention kernels,
schedules, sequence parallelism; --json, the text form, and --emit-config) and records every
invocation's exit status, stdout, stderr and emitted config, so that a later build can be compared
with it byte for byte. It is not a benchmark: it measures nothing, it pins the output.

    python3 bench/plan_outputs.py --out /tmp/plan_before.jsonl            # with build/shardlm
    python3 bench/plan_outputs.py --out /tmp/plan_after.jsonl --binary B  # another binary
    python3 bench/plan_outputs.py --compare /tmp/plan_before.jsonl /tmp/plan_after.jsonl

--compare exits 0 when both files hold the same invocations with byte-identical results, and 1
(printing the first differences) otherwise. Only the standard library is used.
"""

import argparse
import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HF = REPO / "tests" / "data" / "hf_configs"

# (name on the command line, extra options it needs). tiny's max_position_embeddings is 128.
MODELS = [
    ("llama-7b", []),
    ("llama-13b", []),
    ("tiny", ["--seq-len", "128"]),
    (str(HF / "llama-3-8b.json"), []),
    (str(HF / "mistral-7b-v0.1.json"), []),
    (str(HF / "qwen2.5-0.5b.json"), []),
    (str(HF / "smollm2-360m.json"), []),
    (str(HF / "tinyllama-1.1b-chat-v1.0.json"), []),
    (str(HF / "llama-3.2-1b.json"), []),
]


def invocations():
    """The fixed matrix: a list of argument lists (after `shardlm plan`)."""
    out = []
    # 1. Layouts: every model x devices x tp x pp, every ZeRO stage side by side and stage 3 alone,
    #    with a device memory so that the recommendation runs (and without one, for 8 devices).
    for (model, extra), devices, tp, pp in itertools.product(MODELS, [1, 8, 64], [1, 2, 4], [1, 2]):
        base = ["--model", model, *extra, "--devices", str(devices), "--tp", str(tp), "--pp", str(pp)]
        out.append(base + ["--device-memory", "80GB", "--json"])
        out.append(base + ["--device-memory", "24GiB", "--zero-stage", "3", "--json"])
        if devices == 8:
            out.append(base + ["--json"])
    # 2. Options: precision x recompute x attention x schedule x sp on a 3D layout, a few models.
    for (model, extra) in [MODELS[0], MODELS[2], MODELS[3], MODELS[5]]:
        for prec, rec, attn, sched, sp in itertools.product(
                ["fp32", "bf16", "fp16"], ["none", "selective", "full"], ["eager", "fused"],
                ["gpipe", "1f1b"], [False, True]):
            a = ["--model", model, *extra, "--devices", "64", "--tp", "2", "--pp", "2",
                 "--precision", prec, "--recompute", rec, "--attention", attn, "--schedule", sched,
                 "--accumulation", "8", "--device-memory", "40GB", "--json"]
            if sp:
                a.append("--sp")
            out.append(a)
    # 3. ZeRO stages one at a time, micro-batch / accumulation / split / bare counts.
    for (model, extra), stage in itertools.product(MODELS[:3], ["0", "1", "2", "3"]):
        out.append(["--model", model, *extra, "--devices", "8", "--zero-stage", stage,
                    "--micro-batch", "4", "--accumulation", "4", "--device-memory", "80GB", "--json"])
    out.append(["--model", "llama-7b", "--devices", "8", "--pp", "2", "--pipeline-split", "15,17",
                "--device-memory", "80GB", "--json"])
    out.append(["--model", "llama-13b", "--devices", "16", "--tp", "2", "--pp", "4", "--pipeline-split",
                "9,11,10,10", "--accumulation", "16", "--schedule", "gpipe", "--json"])
    out.append(["--model", "llama-70b", "--devices", "64", "--tp", "8", "--pp", "4", "--sp",
                "--recompute", "selective", "--device-memory", "80GB", "--json"])
    for params in ["7e9", "175e9"]:
        for devices in ["1", "64"]:
            out.append(["--params", params, "--devices", devices, "--device-memory", "80GB", "--json"])
    # 4. The text form.
    text = [
        ["--model", "llama-7b", "--devices", "8", "--device-memory", "80GB"],
        ["--model", "llama-7b", "--devices", "8", "--device-memory", "24GB"],
        ["--model", "llama-13b", "--devices", "64", "--tp", "4", "--pp", "2", "--sp", "--recompute", "full",
         "--accumulation", "8", "--device-memory", "40GB"],
        ["--model", "tiny", "--seq-len", "128", "--devices", "1"],
        ["--model", "tiny", "--seq-len", "128", "--devices", "8", "--tp", "2", "--pp", "2", "--precision", "fp16",
         "--attention", "eager", "--schedule", "gpipe", "--zero-stage", "2"],
        ["--model", str(HF / "qwen2.5-0.5b.json"), "--devices", "8", "--tp", "2", "--device-memory", "16GB"],
        ["--model", str(HF / "llama-3-8b.json"), "--devices", "64", "--pp", "2", "--recompute", "selective",
         "--device-memory", "80GB"],
        ["--params", "175e9", "--devices", "64", "--device-memory", "80GB"],
    ]
    out.extend(text)
    # 5. --emit-config (the recommended training config), JSON and text.
    for a in [["--model", "llama-7b", "--devices", "8", "--device-memory", "24GB"],
              ["--model", "llama-13b", "--devices", "64", "--device-memory", "40GB", "--json"],
              ["--model", "tiny", "--seq-len", "128", "--devices", "8", "--tp", "2", "--pp", "2",
               "--device-memory", "1GB", "--json"]]:
        out.append(a + ["--emit-config", "@EMIT@"])
    return out


def run_one(binary, args):
    with tempfile.TemporaryDirectory() as tmp:
        emit = os.path.join(tmp, "emitted.json")
        argv = [binary, "plan", *[emit if a == "@EMIT@" else a for a in args]]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        emitted = None
        if os.path.exists(emit):
            with open(emit, encoding="utf-8", errors="surrogateescape") as f:
                emitted = f.read()
        # The emitted file's path is a temporary name: keep it out of the recorded text.
        dec = lambda b: b.decode("utf-8", "surrogateescape").replace(emit, "@EMIT@")
        # Paths of the repository's configs: relative, so records from two checkouts compare.
        rel = [a.replace(str(REPO) + "/", "") for a in args]
        return {"args": rel, "rc": p.returncode, "stdout": dec(p.stdout).replace(str(REPO) + "/", ""),
                "stderr": dec(p.stderr).replace(str(REPO) + "/", ""), "emitted": emitted}


def record(binary, out_path, jobs):
    cases = invocations()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda a: run_one(binary, a), cases))
    with open(out_path, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    failed = sum(1 for r in results if r["rc"] != 0)
    print(f"recorded {len(results)} invocations of {binary} plan into {out_path} "
          f"({failed} exit non-zero, recorded as they are)")


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(a_path, b_path):
    a, b = load(a_path), load(b_path)
    if [r["args"] for r in a] != [r["args"] for r in b]:
        print(f"different invocation lists: {len(a)} in {a_path}, {len(b)} in {b_path}")
        return 1
    diffs = [(x, y) for x, y in zip(a, b) if x != y]
    for x, y in diffs[:5]:
        print("DIFFERENT: shardlm plan " + " ".join(x["args"]))
        for key in ("rc", "stdout", "stderr", "emitted"):
            if x[key] != y[key]:
                xs, ys = str(x[key]).splitlines(), str(y[key]).splitlines()
                for i, (lx, ly) in enumerate(itertools.zip_longest(xs, ys, fillvalue="<none>")):
                    if lx != ly:
                        print(f"  {key} line {i + 1}:\n    - {lx}\n    + {ly}")
                        break
    print(f"compared {len(a)} invocations: {len(a) - len(diffs)} byte-identical, {len(diffs)} different")
    return 1 if diffs else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="record the matrix's outputs into this JSON-lines file")
    ap.add_argument("--binary", default=str(REPO / "build" / "shardlm"), help="the shardlm binary to run")
    ap.add_argument("--jobs", type=int, default=2, help="invocations run at once")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two recorded files")
    ap.add_argument("--list", action="store_true", help="print the matrix and exit")
    args = ap.parse_args()
    if args.list:
        for a in invocations():
            print("shardlm plan " + " ".join(a))
        return 0
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("give --out FILE or --compare A B")
    record(args.binary, args.out, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
