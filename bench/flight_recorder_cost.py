#!/usr/bin/env python3
"""The collective flight recorder's own cost per step (src/comm/flight_recorder.h), as a fraction of
the step: cost per record x records per step / step time.

Why this file exists: issue 27 asks that the recorder, on by default, cost at most 1% of a step, and
issue 40 gave it a switch (flight_recorder.enabled). Comparing runs with it on and off does not
measure it on this shared 2-core machine: their step times move by several % between repeats,
while the recorder's share is far under 1%. So the three factors are measured apart, each where
it is exact:
  - the cost of one record: `shardlm bench flight-recorder` times N begin/complete pairs as a
    backend makes them for one collective, with the phase label the ZeRO engine builds per call
    (median of 7 interleaved repeats in one process); it also times the same calls with the
    recorder off, which is what a run with flight_recorder.enabled false pays;
  - the records per step: a real 2-rank `shardlm train` run writes, per step, how many operations
    its rank's recorder recorded (metrics.jsonl `flight_records`: every collective and
    point-to-point call of the step, the per-step metrics gathers included);
  - the step time: the same run's metrics.jsonl `step_time_s`.
Both per-run numbers are medians over the steps after the first two (start-up). fraction = record
cost x records per step / step time. Runs: the tiny config (DDP), the tiny config under ZeRO-3 (a
gather and a reduce-scatter per unit: the most records per second of compute there is here) and
the demo config under ZeRO-3. Repeats are interleaved (bench, tiny, tiny ZeRO-3, demo ZeRO-3, then
again); the 1-minute load average is read before and after each.

    /opt/shardlm/venv/bin/python bench/flight_recorder_cost.py [--repeats 3] [--json FILE]
        [--shardlm build/shardlm]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SHARDLM, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402

RUNS = {
    # name: (arguments, steps)
    "tiny (DDP)": (["--config", "configs/tiny.json"], 40),
    "tiny ZeRO-3": (["--config", "configs/tiny.json", "--zero_optimization.stage=3",
                     "--zero_optimization.stage3_param_persistence_threshold=0"], 40),
    "demo ZeRO-3": (["--config", "configs/demo.json", "--zero_optimization.stage=3"], 8),
}
WARM_STEPS = 2  # left out of the medians: the first steps include start-up collectives and allocation


def record_cost_ns(shardlm, repeats):
    """(plain, with phase label, recorder off): ns per begin+complete pair, each the median of `repeats`."""
    out = subprocess.run([str(shardlm), "bench", "flight-recorder", "--repeats", str(repeats)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=clean_env(None), check=True).stdout
    grab = lambda label: float(re.search(re.escape(label) + r"\s+median\s+([\d.]+)", out).group(1))
    return grab("begin+complete"), grab("begin+complete+phase label"), grab("recorder off (same calls)")


def run_once(shardlm, name):
    """Trains `name` on 2 ranks; returns (records per step, step seconds), medians past the warm steps."""
    args, steps = RUNS[name]
    out_dir = fresh_dir(f"/tmp/shardlm_bench_flight_{os.getpid()}")
    run_checked([str(shardlm), "train", *args, "--nproc", "2", f"--steps={steps}", "--log_interval=1",
                 "--data.val=", "--checkpoint_interval=0", f"--out_dir={out_dir}"], clean_env(None), name, 1800)
    rows = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["step"] > WARM_STEPS]
    if not rows or any("flight_records" not in r for r in rows):
        sys.exit(f"{name}: metrics.jsonl has no flight_records column (a shardlm built before it, or the recorder off)")
    return statistics.median(r["flight_records"] for r in rows), statistics.median(r["step_time_s"] for r in rows)


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shardlm", default=str(SHARDLM))
    ap.add_argument("--json", help="also write the measurements here (bench/results/flight_recorder_cost.json)")
    a = ap.parse_args()
    costs, loads = [], []
    rows = {name: [] for name in RUNS}
    for rep in range(a.repeats):
        loads.append(os.getloadavg()[0])
        costs.append(record_cost_ns(a.shardlm, 7))
        print(f"repeat {rep + 1}: record {costs[-1][0]:.0f} ns, with phase label {costs[-1][1]:.0f} ns, "
              f"recorder off {costs[-1][2]:.1f} ns", flush=True)
        for name in RUNS:
            per_step, step_s = run_once(a.shardlm, name)
            rows[name].append((per_step, step_s))
            print(f"  {name}: {per_step:.0f} records/step, step {step_s * 1e3:.1f} ms", flush=True)
        loads.append(os.getloadavg()[0])
    labelled = [c[1] for c in costs]
    record_ns = statistics.median(labelled)
    print(f"\none record (begin+complete+phase label): median {record_ns:.0f} ns over {a.repeats} runs of the bench "
          f"(range {min(labelled):.0f}-{max(labelled):.0f}); recorder off: {statistics.median(c[2] for c in costs):.1f} ns; "
          f"load average {min(loads):.2f}-{max(loads):.2f} (1 min)")
    result = {
        "what": "flight recorder cost per step = record cost x records per step / step time (bench/flight_recorder_cost.py)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "loadavg_1min": spread(loads)},
        "repeats": a.repeats,
        "record_ns": {"plain": spread([c[0] for c in costs]), "phase_label": spread(labelled),
                      "recorder_off": spread([c[2] for c in costs])},
        "runs": {},
    }
    for name, rs in rows.items():
        # Each repeat's fraction with that repeat's own record cost; the medians below are of the repeats.
        fractions = [c[1] * 1e-9 * per_step / step_s for c, (per_step, step_s) in zip(costs, rs)]
        print(f"{name:12s}: recorder {100 * statistics.median(fractions):.4f}% of the step "
              f"(range {100 * min(fractions):.4f}-{100 * max(fractions):.4f}%), "
              f"{statistics.median(p for p, _ in rs):.0f} records/step, step {1e3 * statistics.median(s for _, s in rs):.1f} ms")
        result["runs"][name] = {"arguments": RUNS[name][0] + ["--nproc", "2", f"--steps={RUNS[name][1]}"],
                                "records_per_step": spread([p for p, _ in rs]),
                                "step_time_s": spread([s for _, s in rs]),
                                "fraction_of_step": spread(fractions)}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
