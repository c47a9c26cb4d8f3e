#!/usr/bin/env python3
"""Collectives at memory speed and coalesced ZeRO reductions (issue 12), before and after, in one run.

    /opt/shardlm/venv/bin/python bench/comm_speed.py            # full run, ~15 minutes
    /opt/shardlm/venv/bin/python bench/comm_speed.py --quick    # smoke run, ~3 minutes

"Before" and "after" are the same binary: SHARDLM_COMM_SHM=0 sends every collective through
OpenMPI's non-blocking collectives (no shared-memory path, src/comm/shm_group.h) and
--zero_optimization.reduce_bucket_size=0 reduce-scatters ZeRO gradients unit by unit (no buckets,
src/parallel/zero/zero_buckets.h), as the code did before both existed. Two parts:

  1. `shardlm bench comm` on 2 and 4 ranks, 16 MB and 64 MB, blocking and non-blocking calls
     (--nonblocking: the _async form polled with test(), as the trainer does): busbw as a fraction of
     the memcpy bandwidth measured in the same run, before and after.
  2. tokens/s of `shardlm train` on the demo model, 2 ranks x 1 thread, fp32: stage 0 (DDP) and
     ZeRO stages 1-3, before and after; ZeRO-3 against stage 0; and 1 rank against 2 (scaling).

Timed training runs are interleaved (each repeat runs every configuration once, in an order
rotated by one per repeat) and the first --warmup steps of every run are dropped. The machine is
shared and has 2 cores: only ratios measured in the same invocation mean anything.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Config, add_model_args, add_run_length_args, add_shardlm_arg, clean_env, fresh_dir,  # noqa: E402
                    parse_run_length_args, read_metrics, run_checked, shardlm_overrides)

FULL_DEFAULTS = dict(steps=12, warmup=3, repeats=2, micro_batch=8, seq_len=128, model_set=[])
QUICK_DEFAULTS = dict(steps=3, warmup=1, repeats=1, micro_batch=4, seq_len=64,
                      model_set=["num_hidden_layers=2", "hidden_size=192", "intermediate_size=512"])
BEFORE = {"SHARDLM_COMM_SHM": "0"}
BEFORE_TRAIN_ARGS = ["--zero_optimization.reduce_bucket_size=0"]  # unit by unit, no buckets
OPS = ("all_reduce", "reduce_scatter", "all_gather")


def bench_comm(args, nproc, before, nonblocking, json_path):
    cmd = [str(args.binary), "bench", "comm", "--nproc", str(nproc), "--min-bytes", "16M", "--max-bytes",
           "64M", "--ops", ",".join(OPS), "--json", str(json_path)]
    if args.quick:
        cmd += ["--iters", "3", "--warmup", "1"]
    if nonblocking:
        cmd.append("--nonblocking")
    run_checked(cmd, clean_env(1, BEFORE if before else None), "shardlm bench comm")
    res = json.loads(Path(json_path).read_text())
    return {(r["op"], r["size_bytes"]): (r["busbw_over_memcpy"], r["busbw_over_memcpy_share"])
            for r in res["results"]}


def core_path_probe(work):
    """bench/core_to_core.c, compiled once: a callable returning its JSON (None without a C compiler)."""
    exe = work / "core_to_core"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not exe.exists():
        if not cc:
            return lambda: None
        run_checked([cc, "-O2", "-o", str(exe), str(Path(__file__).resolve().parent / "core_to_core.c")],
                    clean_env(1), "cc core_to_core.c")
    def read():
        p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
        return json.loads(p.stdout) if p.returncode == 0 else None  # e.g. a 1-CPU machine
    return read


def part1(args, work):
    print("\n1. busbw / memcpy; before = OpenMPI (libnbc), after = shared memory. memcpy: of rank 0 alone, timed\n"
          "   interleaved with each row; [share]: after, against each rank's memcpy while all ranks copy at once\n"
          "   (the fair ceiling where every rank streams, and with more ranks than cores). path: the host's\n"
          "   core-to-core path right before and after the 'after' run (bench/core_to_core.c: cache-line round\n"
          "   trip, 1 MiB exchanged between CPUs 0 and 1): where it is slow (~500 ns, ~2 GB/s instead of ~100 ns,\n"
          "   ~20 GB/s) every shared-memory collective is too, whatever the code does")
    probe = core_path_probe(work)
    head = (f"{'ranks':>5} {'calls':>12} {'size':>6} " + " ".join(f"{op + ' b/a':>24}" for op in OPS)
            + " " + " ".join(f"{op[:10] + ' [share]':>18}" for op in OPS) + f" {'path ns, GB/s':>26}")
    print(head)
    for nproc in (2, 4):
        for nb in (False, True):
            got = {"before": bench_comm(args, nproc, True, nb, work / f"comm_{nproc}_{nb}_before.json")}
            paths = [probe()]
            got["after"] = bench_comm(args, nproc, False, nb, work / f"comm_{nproc}_{nb}_after.json")
            paths.append(probe())
            path = " / ".join(f"{p['round_trip_ns']:.0f}, {p['exchange_gbps']:.1f}" for p in paths if p) or "-"
            sizes = sorted({b for (_, b) in got["after"]})
            for size in sizes:
                cells, shares = [], []
                for op in OPS:
                    b, a = got["before"].get((op, size)), got["after"].get((op, size))
                    cells.append(f"{b[0]:.2f} -> {a[0]:.2f} ({a[0] / b[0]:.1f}x)" if a and b else "-")
                    shares.append(f"{a[1]:.2f}" if a else "-")
                print(f"{nproc:>5} {'non-blocking' if nb else 'blocking':>12} {size >> 20:>4}MB "
                      + " ".join(f"{c:>24}" for c in cells) + " " + " ".join(f"{c:>18}" for c in shares)
                      + f" {path:>26}")


def run_train(args, nproc, stage, before, out_dir):
    out_dir = fresh_dir(out_dir)
    cmd = [str(args.binary), "train", "--config", str(args.config), "--nproc", str(nproc), f"--steps={args.steps}",
           f"--out_dir={out_dir}", "--threads=1", "--resume=false", f"--log_interval={args.steps}",
           f"--zero_optimization.stage={stage}", *shardlm_overrides(args), *(BEFORE_TRAIN_ARGS if before else [])]
    run_checked(cmd, clean_env(1, BEFORE if before else None), f"shardlm train {nproc} rank(s) stage {stage}")
    return read_metrics(out_dir / "metrics.jsonl")


def part2(args, work):
    configs = []
    for when in ("before", "after"):
        for stage in (0, 1, 2, 3):
            configs.append(Config((when, 2, stage), f"{when:>6} 2 ranks stage {stage}",
                                  lambda d, s=stage, b=(when == "before"): run_train(args, 2, s, b, d)))
        configs.append(Config((when, 1, 0), f"{when:>6} 1 rank  stage 0",
                              lambda d, b=(when == "before"): run_train(args, 1, 0, b, d)))
    for rep in range(args.repeats):
        for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
            c.repeats.append(c.run(work / "run"))
            print(f"  ran {c.label} (repeat {rep + 1}/{args.repeats})", file=sys.stderr)
    s = {c.key: c.stats(args.warmup) for c in configs}
    print(f"\n2. tokens/s, demo model{' (quick: shrunk)' if args.quick else ''}, fp32, 1 thread per rank; "
          f"median over {args.repeats} run(s) x {args.steps - args.warmup} steps")
    print(f"{'':>22} {'before':>9} {'after':>9} {'after/before':>13}")
    for stage in (0, 1, 2, 3):
        b, a = s[("before", 2, stage)]["median"], s[("after", 2, stage)]["median"]
        name = "stage 0 (DDP)" if stage == 0 else f"ZeRO-{stage}"
        print(f"{'2 ranks ' + name:>22} {b:>9.0f} {a:>9.0f} {a / b:>12.2f}x")
    b1, a1 = s[("before", 1, 0)]["median"], s[("after", 1, 0)]["median"]
    print(f"{'1 rank stage 0':>22} {b1:>9.0f} {a1:>9.0f} {a1 / b1:>12.2f}x")
    for when in ("before", "after"):
        z3, s0 = s[(when, 2, 3)]["median"], s[(when, 2, 0)]["median"]
        print(f"{when:>6}: ZeRO-3 / stage 0 = {z3 / s0:.3f};  scaling 2 ranks / 1 rank (stage 0) = "
              f"{s0 / s[(when, 1, 0)]['median']:.2f}x")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS, quick_time="~3 min")
    add_shardlm_arg(p)
    add_model_args(p)
    p.add_argument("--skip-comm", action="store_true", help="only part 2 (training)")
    p.add_argument("--skip-train", action="store_true", help="only part 1 (bench comm)")
    p.add_argument("--work-dir", type=Path, help="keep every run's files here (default: a temporary directory)")
    return parse_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)


def main():
    args = parse_args()
    if not args.shardlm.exists():
        sys.exit(f"{args.shardlm} not found: build it first (cmake --build build -j2) or pass --shardlm PATH")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="comm_speed."))
    work.mkdir(parents=True, exist_ok=True)
    args.binary = work / "shardlm"  # a copy: a rebuild of build/ during the run cannot mix two builds
    shutil.copy2(args.shardlm, args.binary)
    t0 = time.time()
    load = os.getloadavg()[0]
    print(f"load average before start: {load:.2f}" + ("  (other work is running: expect noisy numbers)"
                                                       if load > 0.5 else ""))
    if not args.skip_comm:
        part1(args, work)
    if not args.skip_train:
        part2(args, work)
    print(f"\n{time.time() - t0:.0f} s; load average at the end: {os.getloadavg()[0]:.2f}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
