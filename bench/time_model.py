#!/usr/bin/env python3
"""The planner's time model against measured steps (issue 26): predicted and measured step time of
every layout that runs at 2 ranks x 1 thread here, and whether `plan --search`'s first choice is the
measured fastest.

Why: `shardlm plan --machine FILE` predicts seconds per step from rates `shardlm bench machine`
measured (src/plan/time_model.h). A prediction is only useful if it lands near what the trainer then
does; this script measures both in one invocation:

    /opt/shardlm/venv/bin/python bench/time_model.py --quick          # ~4 min on 2 cores
    /opt/shardlm/venv/bin/python bench/time_model.py --json out.json  # 5 repeats, ~15 min

1. `shardlm bench machine --nproc 2 --threads 1 --model M --micro-batch B --seq-len S --out machine.json`
   (the model's own product shapes and attention shape, every rank measuring at once);
2. per layout (DDP = ZeRO 0, ZeRO 1/2/3, TP 2, TP 2 + SP, PP 2 with GPipe and 1F1B, and full
   recomputation at ZeRO 0), interleaved over the repeats: `shardlm train --steps=N` (median of
   step_time_s and the time_* phases over the steps after the first two) beside
   `shardlm plan --machine machine.json --json` for the same layout (its predicted step_s and phases);
3. the ratio measured / predicted per layout (median over repeats, with min-max), the load average
   before and after, and `plan --search` over the same global batch: its first choice's measured
   time against the fastest measured layout.
More ranks than cores would time the OS scheduler, not the layout: everything here runs at 2 ranks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, SHARDLM  # noqa: E402

LAYOUTS = [
    ("zero0", ["--zero_optimization.stage=0"], ["--zero-stage", "0"]),
    ("zero1", ["--zero_optimization.stage=1"], ["--zero-stage", "1"]),
    ("zero2", ["--zero_optimization.stage=2"], ["--zero-stage", "2"]),
    ("zero3", ["--zero_optimization.stage=3"], ["--zero-stage", "3"]),
    ("tp2", ["--parallelism.tensor_parallel=2"], ["--zero-stage", "0", "--tp", "2"]),
    ("tp2_sp", ["--parallelism.tensor_parallel=2", "--parallelism.sequence_parallel=true"],
     ["--zero-stage", "0", "--tp", "2", "--sp"]),
    ("pp2_gpipe", ["--parallelism.pipeline_parallel=2", "--parallelism.pipeline_schedule=gpipe"],
     ["--zero-stage", "0", "--pp", "2", "--schedule", "gpipe"]),
    ("pp2_1f1b", ["--parallelism.pipeline_parallel=2", "--parallelism.pipeline_schedule=1f1b"],
     ["--zero-stage", "0", "--pp", "2", "--schedule", "1f1b"]),
    # The demo's 6 layers split into 2 stages x 3 chunks (interleaved needs layers divisible by p*v).
    ("pp2_interleaved_v3", ["--parallelism.pipeline_parallel=2", "--parallelism.pipeline_schedule=interleaved_1f1b",
                            "--parallelism.virtual_pipeline_parallel=3"],
     ["--zero-stage", "0", "--pp", "2", "--schedule", "interleaved_1f1b", "--vpp", "3"]),
    ("pp2_zb_h1", ["--parallelism.pipeline_parallel=2", "--parallelism.pipeline_schedule=zb_h1"],
     ["--zero-stage", "0", "--pp", "2", "--schedule", "zb_h1"]),
    ("zero0_full_recompute", ["--zero_optimization.stage=0", "--activation_checkpointing.mode=full"],
     ["--zero-stage", "0", "--recompute", "full"]),
]
PHASES = [("forward_s", "time_forward_s"), ("backward_s", "time_backward_s"), ("optimizer_s", "time_optimizer_s")]


def run(cmd, timeout=3600):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                                OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def measure(args, layout, train_extra, work):
    out_dir = os.path.join(work, layout)
    run([SHARDLM, "train", "--config", args.config, "--nproc", "2", "--threads=1", f"--steps={args.steps}",
         "--data.val=", f"--out_dir={out_dir}", "--resume=false", f"--train_micro_batch_size_per_gpu={args.micro_batch}",
         f"--gradient_accumulation_steps={args.accumulation}", f"--data.seq_len={args.seq_len}", "--log_interval=1",
         "--checkpoint_interval=0", *train_extra])
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "step_time_s" in r][2:]  # the first two steps warm the allocator and caches
    out = {"step_s": statistics.median(r["step_time_s"] for r in rows)}
    for ours, theirs in PHASES:
        out[ours] = statistics.median(r.get(theirs, 0.0) for r in rows)
    return out


def predict(args, plan_extra, machine):
    # The plan's micro-batch and accumulation are one data-parallel rank's; its devices the job's.
    j = json.loads(run([SHARDLM, "plan", "--model", args.model, "--devices", "2", "--micro-batch", args.micro_batch,
                        "--seq-len", args.seq_len, "--accumulation", args.accumulation, "--precision", "fp32",
                        "--machine", machine, "--json", *plan_extra]))
    return j["predicted"]["stages"][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "demo.json"))
    ap.add_argument("--model", default="demo", help="the config's model as `plan --model` names it")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 repeats of 6 steps")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--layouts", help="comma-separated subset of the layouts to run (default: all)")
    args = ap.parse_args()
    if args.layouts:
        keep = args.layouts.split(",")
        unknown = set(keep) - {name for name, _, _ in LAYOUTS}
        if unknown:
            sys.exit(f"unknown layouts {sorted(unknown)}; known: {[name for name, _, _ in LAYOUTS]}")
        LAYOUTS[:] = [entry for entry in LAYOUTS if entry[0] in keep]
    if args.quick:
        args.repeats, args.steps = 2, 6
    work = tempfile.mkdtemp(prefix="shardlm_time_model_")
    load_before = os.getloadavg()
    machine = os.path.join(work, "machine.json")
    t0 = time.time()
    run([SHARDLM, "bench", "machine", "--nproc", "2", "--threads", "1", "--model", args.model, "--micro-batch",
         args.micro_batch, "--seq-len", args.seq_len, "--dtypes", "fp32", "--out", machine])
    predicted = {name: predict(args, plan_extra, machine) for name, _, plan_extra in LAYOUTS}
    measured = {name: [] for name, _, _ in LAYOUTS}
    for rep in range(args.repeats):  # interleaved: a slow minute touches every layout alike
        for name, train_extra, _ in LAYOUTS:
            measured[name].append(measure(args, name, train_extra, work))
            print(f"repeat {rep + 1}/{args.repeats} {name}: {measured[name][-1]['step_s']:.4f} s "
                  f"(predicted {predicted[name]['step_s']:.4f})", flush=True)
    results = {}
    print(f"\n{'layout':24s} {'predicted s':>11s} {'measured s':>11s} {'measured/predicted':>20s}  phases (fwd, bwd, opt)")
    for name, _, _ in LAYOUTS:
        steps = [m["step_s"] for m in measured[name]]
        ratios = [s / predicted[name]["step_s"] for s in steps]
        phase = {ours: statistics.median(m[ours] for m in measured[name]) / predicted[name][ours]
                 for ours, _ in PHASES if predicted[name][ours] > 0}
        results[name] = {"predicted": predicted[name], "measured": measured[name],
                         "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios), "phase_ratios": phase}
        print(f"{name:24s} {predicted[name]['step_s']:11.4f} {statistics.median(steps):11.4f} "
              f"{statistics.median(ratios):8.3f} ({min(ratios):.3f}-{max(ratios):.3f})  "
              + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in phase.items()))
    fastest = min(results, key=lambda n: statistics.median(m["step_s"] for m in measured[n]))
    # The search over exactly these layouts' knobs: its first choice among the measured ones.
    ranked = sorted(results, key=lambda n: predicted[n]["step_s"])
    first = ranked[0]
    med = {n: statistics.median(m["step_s"] for m in measured[n]) for n in results}
    summary = {"machine": json.load(open(machine)), "load_before": load_before, "load_after": os.getloadavg(),
               "seconds": time.time() - t0, "repeats": args.repeats, "steps": args.steps,
               "shape": {"model": args.model, "micro_batch": args.micro_batch, "accumulation": args.accumulation,
                         "seq_len": args.seq_len, "ranks": 2, "threads": 1},
               "layouts": results, "predicted_fastest": first, "measured_fastest": fastest,
               "predicted_first_over_measured_fastest": med[first] / med[fastest],
               "within_15_percent": all(abs(r["ratio_median"] - 1) <= 0.15 for r in results.values())}
    print(f"\npredicted fastest {first}: measured {med[first]:.4f} s, {med[first] / med[fastest]:.3f}x the measured "
          f"fastest ({fastest}, {med[fastest]:.4f} s); every layout within 15%: {summary['within_15_percent']}; "
          f"load average {load_before[0]:.2f} -> {summary['load_after'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
