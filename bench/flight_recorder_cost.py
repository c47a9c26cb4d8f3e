#!/usr/bin/env python3
"""The collective flight recorder's own cost per step (src/comm/flight_recorder.h), as a fraction of
the step: (records each rank writes per second of training) x (seconds one record costs).

Why this file exists: issue 27 asks that the recorder, on by default, cost at most 1% of a step. A
run with it off does not exist (it is always on, and a switch only to measure it would measure the
noise of this shared 2-core machine, several % between repeats, not a cost well under 1%), so the
two factors are measured apart, each where it is exact:
  - the cost of one record: `shardlm bench flight-recorder` times N begin/complete pairs as a
    backend makes them for one collective, with the phase label the ZeRO engine builds per call
    (median of 7 interleaved repeats in one process);
  - the records per second: a real 2-rank `shardlm train` run is asked for its flight records twice
    (`flight_recorder/dump_request`, as a user would); each dump holds `recorded` (operations
    recorded since start) and `time`, so the rate between them counts every collective and
    point-to-point call the backends recorded, whatever the layout.
fraction = rate x cost (the recorder's seconds per second of training: no step time needed);
records per step = rate / the steps per second between the dumps (their `step N/` lines' arrival).
Runs: the tiny config (DDP), the tiny config under ZeRO-3 (a gather and a reduce-scatter per unit,
the most records per second of compute there is here) and the demo config under ZeRO-3. Repeats are
interleaved (bench, tiny, tiny ZeRO-3, demo ZeRO-3, then again) and the load average is printed.

    /opt/shardlm/venv/bin/python bench/flight_recorder_cost.py [--repeats 3] [--json FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SHARDLM, clean_env, fresh_dir, kill_session  # noqa: E402

RUNS = {
    # name: (arguments, step to wait for before the first dump, seconds between the dumps)
    "tiny (DDP)": (["--config", "configs/tiny.json"], 20, 4.0),
    "tiny ZeRO-3": (["--config", "configs/tiny.json", "--zero_optimization.stage=3",
                     "--zero_optimization.stage3_param_persistence_threshold=0"], 20, 4.0),
    "demo ZeRO-3": (["--config", "configs/demo.json", "--zero_optimization.stage=3"], 2, 15.0),
}


def cost_ns(repeats):
    out = subprocess.run([str(SHARDLM), "bench", "flight-recorder", "--repeats", str(repeats)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=clean_env(None), check=True).stdout
    plain = float(re.search(r"begin\+complete\s+median\s+([\d.]+)", out).group(1))
    labelled = float(re.search(r"begin\+complete\+phase label\s+median\s+([\d.]+)", out).group(1))
    return plain, labelled


def dumps(out_dir, after):
    """Asks every rank for its flight record; returns {rank: (recorded, time)} once both wrote one."""
    fr = Path(out_dir) / "flight_recorder"
    fr.mkdir(exist_ok=True)
    (fr / "dump_request").write_text(f"dump {time.time()}\n")
    deadline = time.time() + 30
    while time.time() < deadline:
        got = {}
        for r in (0, 1):
            try:
                d = json.loads((fr / f"rank{r}.json").read_text())
            except (OSError, ValueError):
                continue
            if d["reason"].startswith("requested") and d["time"] > after:
                got[r] = (d["recorded"], d["time"])
        if len(got) == 2:
            return got
        time.sleep(0.05)
    sys.exit(f"no flight records in {fr} within 30 s")


def records_per_second(name):
    args, warm_step, window = RUNS[name]
    out_dir = fresh_dir(f"/tmp/shardlm_bench_flight_{os.getpid()}")
    cmd = [str(SHARDLM), "train", *args, "--nproc", "2", "--steps=100000", "--log_interval=1", "--data.val=",
           "--checkpoint_interval=0", f"--out_dir={out_dir}"]
    p = subprocess.Popen(cmd, cwd=REPO, env=clean_env(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    lines = []  # (arrival time, line)
    reader = threading.Thread(target=lambda: lines.extend((time.time(), l) for l in p.stdout), daemon=True)
    reader.start()  # drains the pipe
    try:
        deadline = time.time() + 600
        while not any(l.startswith(f"step {warm_step}/") for _, l in list(lines)):
            if p.poll() is not None or time.time() > deadline:
                sys.exit(f"{name}: the run ended or stalled before step {warm_step}:\n" + "".join(l for _, l in lines[-20:]))
            time.sleep(0.05)
        first = dumps(out_dir, time.time())
        time.sleep(window)
        second = dumps(out_dir, max(t for _, t in first.values()))
    finally:
        kill_session(p.pid)
        p.wait()
    rates = [(second[r][0] - first[r][0]) / (second[r][1] - first[r][1]) for r in (0, 1)]
    t1, t2 = max(t for _, t in first.values()), min(t for _, t in second.values())
    done = [t for t, l in list(lines) if l.startswith("step ") and t1 <= t <= t2]
    wall_step_s = (done[-1] - done[0]) / (len(done) - 1) if len(done) > 1 else float("nan")
    return statistics.mean(rates), wall_step_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the measurements here")
    a = ap.parse_args()
    rows = {name: [] for name in RUNS}
    costs = []
    loads = [os.getloadavg()[0]]
    for rep in range(a.repeats):
        costs.append(cost_ns(7))
        print(f"repeat {rep + 1}: record {costs[-1][0]:.0f} ns, with phase label {costs[-1][1]:.0f} ns", flush=True)
        for name in RUNS:
            rate, step_s = records_per_second(name)
            rows[name].append((rate, step_s))
            print(f"  {name}: {rate:.0f} records/s per rank, step {step_s * 1e3:.1f} ms (wall, between steps), "
                  f"{rate * step_s:.0f} records/step", flush=True)
        loads.append(os.getloadavg()[0])
    labelled = statistics.median(c[1] for c in costs)
    print(f"\none record (begin+complete+label): median {labelled:.0f} ns over {a.repeats} runs of the bench "
          f"(range {min(c[1] for c in costs):.0f}-{max(c[1] for c in costs):.0f}); "
          f"load average {min(loads):.2f}-{max(loads):.2f} (1 min)")
    result = {"record_ns": costs, "loadavg": loads, "runs": {}}
    for name, rs in rows.items():
        fr = [rate * labelled * 1e-9 for rate, _ in rs]  # the recorder's seconds per second of training
        per_step = [rate * step_s for rate, step_s in rs]
        print(f"{name:12s}: recorder {100 * statistics.median(fr):.3f}% of the step "
              f"(range {100 * min(fr):.3f}-{100 * max(fr):.3f}%), {statistics.median(per_step):.0f} records/step, "
              f"step {1e3 * statistics.median(s for _, s in rs):.1f} ms (wall)")
        result["runs"][name] = {"records_per_s": [r for r, _ in rs], "step_s": [s for _, s in rs],
                                "fraction": fr, "records_per_step": per_step}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
