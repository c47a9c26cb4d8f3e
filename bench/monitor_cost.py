#!/usr/bin/env python3
"""What the TensorBoard and CSV monitors (docs/monitoring.md) cost, as a fraction of a step:
(cost of writing one step record) x (records per step: one) / (the step's time).

Why this file exists: issue 44 asks that writing events cost at most 1% of a step. A run with the
monitors on against one with them off, on this shared 2-core machine, measures the noise (several % of a
step between repeats), not a cost well under 1%. So the factors are measured apart, each where it is
exact:
  - the step time and the record: a real `shardlm train` run with tensorboard and csv_monitor on and
    log_interval 1 (a flush at every step, the most writes there are); its metrics.jsonl gives the median
    step_time_s after the first step, and holds the records with every field the run reports;
  - the cost of writing one record: `shardlm bench monitors --metrics RUN/metrics.jsonl` writes those
    records again, 2000 per repeat, through the event writer and the CSV monitor, each one flushed
    (median of 5 interleaved repeats in one process).
fraction = cost per record / step time. The cost per scalar (cost per record / fields per record) is
printed too. Runs: the tiny config on 1 rank (the shortest step there is here: the worst case) and on 2
ranks under ZeRO-3 (more fields: per-rank memory, gathers and reduce-scatters). Repeats are interleaved
and the load average printed.

    /opt/shardlm/venv/bin/python bench/monitor_cost.py [--repeats 3] [--json FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SHARDLM, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402

RUNS = {
    # name: arguments of `shardlm train`
    "tiny, 1 rank": ["--config", "configs/tiny.json", "--nproc", "1", "--steps=40"],
    "tiny ZeRO-3, 2 ranks": ["--config", "configs/tiny.json", "--nproc", "2", "--steps=40",
                             "--zero_optimization.stage=3"],
}


def train(name, out_dir):
    out_dir = fresh_dir(out_dir)
    cmd = [str(SHARDLM), "train", *RUNS[name], f"--out_dir={out_dir}/run", "--log_interval=1", "--checkpoint_interval=0",
           "--tensorboard.enabled=true", f"--tensorboard.output_path={out_dir}", "--csv_monitor.enabled=true",
           f"--csv_monitor.output_path={out_dir}"]
    run_checked(cmd, clean_env(None), name)
    records = read_metrics(out_dir / "run" / "metrics.jsonl")
    step_s = statistics.median(r["step_time_s"] for r in records[1:])
    fields = statistics.median(sum(1 for k, v in r.items() if k != "step" and (v is None or isinstance(v, (int, float))))
                               for r in records)
    return out_dir / "run" / "metrics.jsonl", step_s, fields


def cost_us(metrics):
    out = subprocess.run([str(SHARDLM), "bench", "monitors", "--metrics", str(metrics)], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env=clean_env(None), check=True).stdout
    tb = float(re.search(r"tensorboard per record\s+median\s+([\d.]+)", out).group(1))
    csv = float(re.search(r"csv per record\s+median\s+([\d.]+)", out).group(1))
    return tb, csv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the measurements here")
    a = ap.parse_args()
    rows = {name: [] for name in RUNS}
    loads = [os.getloadavg()[0]]
    for rep in range(a.repeats):
        for name in RUNS:
            metrics, step_s, fields = train(name, f"/tmp/shardlm_bench_monitors_{os.getpid()}")
            tb, csv = cost_us(metrics)
            rows[name].append({"step_s": step_s, "fields_per_record": fields, "tensorboard_us_per_record": tb,
                               "csv_us_per_record": csv, "fraction": (tb + csv) * 1e-6 / step_s})
            print(f"repeat {rep + 1} {name}: step {step_s * 1e3:.1f} ms, {fields:.0f} fields; per record "
                  f"tensorboard {tb:.1f} us, csv {csv:.1f} us: {100 * rows[name][-1]['fraction']:.3f}% of the step",
                  flush=True)
        loads.append(os.getloadavg()[0])
    result = {"loadavg_1min": loads, "runs": {}}
    print(f"\nload average {min(loads):.2f}-{max(loads):.2f} (1 min)")
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        per_scalar = (med["tensorboard_us_per_record"] + med["csv_us_per_record"]) / med["fields_per_record"]
        print(f"{name}: tensorboard + csv {100 * med['fraction']:.3f}% of the step (range "
              f"{100 * min(r['fraction'] for r in rs):.3f}-{100 * max(r['fraction'] for r in rs):.3f}%): "
              f"{med['tensorboard_us_per_record']:.1f} + {med['csv_us_per_record']:.1f} us per record "
              f"({per_scalar:.2f} us per scalar x {med['fields_per_record']:.0f} scalars) / {1e3 * med['step_s']:.1f} ms")
        result["runs"][name] = {"repeats": rs, "median": med, "us_per_scalar": per_scalar}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
