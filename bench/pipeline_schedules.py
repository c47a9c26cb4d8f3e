#!/usr/bin/env python3
"""GPipe, 1F1B, interleaved 1F1B and ZB-H1 side by side: step time, measured bubble against the formula.

Run with the virtual environment's python (/opt/shardlm/venv, made by scripts/setup.sh), from anywhere:

    /opt/shardlm/venv/bin/python bench/pipeline_schedules.py            # ~15 minutes, writes the JSON
    /opt/shardlm/venv/bin/python bench/pipeline_schedules.py --quick    # ~3 minutes, prints only

The demo model with 8 decoder layers (so interleaved's v = 2 chunks split evenly at p = 2 and 4),
micro-batch 2 x 128 tokens, m = 8 micro-batches per step, 1 thread per rank, fp32. Every repeat runs
all four schedules at p = 2 (2 ranks) and p = 4 (4 ranks) one after the other, so a change in the
machine's load touches every schedule alike; each run's figure is the median over its measured steps
(the first ones skipped), and the table shows the median over repeats with the spread (min-max).
Per run, from metrics.jsonl:
  step s        step_time_s (the whole optimizer step);
  bubble        pipeline_bubble, the stages' mean of 1 - (time computing) / (first forward to last
                backward), and the formula the schedule states ((p-1)/(m+p-1); interleaved
                (p-1)/(v*m+p-1));
  alive         pipeline_alive_micro_batches on stage 0 and the last stage ((micro-batch, chunk)
                pairs for interleaved);
  F / B / W     pipeline_forward_s, pipeline_backward_s and (zb_h1) pipeline_weight_backward_s per
                stage: the step's forwards, backwards (zb_h1's B: the input products dX) and zb_h1's
                W (the weight products dW), summed over the micro-batches (in the JSON per repeat,
                and for stage 0 in the table).
p = 4 runs 4 ranks on this machine's cores: with fewer cores than ranks the OS scheduler, not the
schedule, sets the idle time (the load average is recorded before and after). The JSON goes to
bench/results/pipeline_schedules.json with the machine's description.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1))


def machine():
    model = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "platform": platform.platform()}


def run_one(binary, work, pp, schedule, vpp, m, steps, tag):
    out = fresh_dir(work / f"{schedule}_pp{pp}_{tag}")
    cmd = [str(binary), "train", "--config", str(REPO / "configs" / "demo.json"), "--nproc", str(pp),
           "--threads=1", f"--steps={steps}", f"--out_dir={out}", "--resume=false", "--data.val=",
           "--model.num_hidden_layers=8", f"--parallelism.pipeline_parallel={pp}",
           f"--parallelism.pipeline_schedule={schedule}", f"--parallelism.virtual_pipeline_parallel={vpp}",
           f"--gradient_accumulation_steps={m}", "--train_micro_batch_size_per_gpu=2", "--data.seq_len=128",
           f"--log_interval={steps}", "--checkpoint_interval=0"]
    run_checked(cmd, clean_env(1), f"shardlm {schedule} pp={pp}")
    return read_metrics(out / "metrics.jsonl")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat, 4 steps per run, p = 2 only; no JSON")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stages", default="2,4", help="pipeline sizes to run (default 2,4)")
    p.add_argument("--shardlm", type=Path, default=REPO / "build" / "shardlm")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pipeline_schedules.json")
    args = p.parse_args()
    repeats = 1 if args.quick else args.repeats
    steps, skip = (4, 2) if args.quick else (6, 2)
    stages = [2] if args.quick else [int(s) for s in args.stages.split(",")]
    m = 8
    work = Path(tempfile.mkdtemp(prefix="shardlm_pp_sched_"))
    binary = work / "shardlm"
    shutil.copy2(args.shardlm, binary)
    load_before = os.getloadavg()
    started = time.time()
    runs = {}  # (pp, schedule) -> list of per-repeat dicts
    for r in range(repeats):
        for pp in stages:
            for schedule, vpp in SCHEDULES:
                rows = run_one(binary, work, pp, schedule, vpp, m, steps, f"r{r}")
                measured = [row for row in rows if row["step"] > skip]

                def med(key):
                    return statistics.median(row[key] for row in measured)

                runs.setdefault((pp, schedule), []).append({
                    "step_time_s": med("step_time_s"),
                    "tokens_per_s": med("tokens_per_s"),
                    "bubble": med("pipeline_bubble"),
                    "bubble_per_stage": [med(f"pipeline_bubble.stage{s}") for s in range(pp)],
                    "bubble_formula": measured[0]["pipeline_bubble_formula"],
                    "alive_first": med("pipeline_alive_micro_batches.stage0"),
                    "alive_last": med(f"pipeline_alive_micro_batches.stage{pp - 1}"),
                    "loss_last": rows[-1]["loss"],
                    # per stage, summed over the step's micro-batches: forwards, backwards (zb_h1: its
                    # Bs, the input products) and zb_h1's Ws (the weight products)
                    "forward_s_per_stage": [med(f"pipeline_forward_s.stage{s}") for s in range(pp)],
                    "backward_s_per_stage": [med(f"pipeline_backward_s.stage{s}") for s in range(pp)],
                    "weight_backward_s_per_stage": [med(f"pipeline_weight_backward_s.stage{s}") for s in range(pp)]
                    if schedule == "zb_h1" else None,
                })
            print(f"repeat {r + 1}/{repeats} p={pp} done ({time.time() - started:.0f} s)", flush=True)
    load_after = os.getloadavg()

    print(f"\n== pipeline schedules: demo model, 8 layers, m = {m} micro-batches of 2 x 128, 1 thread per rank, "
          f"{repeats} repeat(s) x {steps - skip} measured steps ==")
    head = (f"{'p':>2} {'schedule':<17} {'step s (min-max)':>22} {'vs 1f1b':>8} {'bubble (min-max)':>22} "
            f"{'formula':>8} {'alive s0/last':>14} {'loss step ' + str(steps):>13} {'s0 F/B/W s':>18}")
    print(head)
    print("-" * len(head))
    summary = []
    for pp in stages:
        base = statistics.median(x["step_time_s"] for x in runs[(pp, "1f1b")])
        for schedule, vpp in SCHEDULES:
            xs = runs[(pp, schedule)]
            st = [x["step_time_s"] for x in xs]
            bu = [x["bubble"] for x in xs]
            row = {"pp": pp, "schedule": schedule, "virtual_pipeline_parallel": vpp,
                   "step_time_s_median": statistics.median(st), "step_time_s_min": min(st), "step_time_s_max": max(st),
                   "step_time_vs_1f1b": statistics.median(st) / base,
                   "bubble_median": statistics.median(bu), "bubble_min": min(bu), "bubble_max": max(bu),
                   "bubble_formula": xs[0]["bubble_formula"],
                   "bubble_per_stage_median": [statistics.median(x["bubble_per_stage"][s] for x in xs) for s in range(pp)],
                   "alive_first_stage": xs[0]["alive_first"], "alive_last_stage": xs[0]["alive_last"],
                   "loss_last_step": [x["loss_last"] for x in xs], "repeats": xs,
                   "forward_s_per_stage_median": [statistics.median(x["forward_s_per_stage"][s] for x in xs)
                                                  for s in range(pp)],
                   "backward_s_per_stage_median": [statistics.median(x["backward_s_per_stage"][s] for x in xs)
                                                   for s in range(pp)],
                   "weight_backward_s_per_stage_median": [statistics.median(x["weight_backward_s_per_stage"][s]
                                                                            for x in xs) for s in range(pp)]
                   if schedule == "zb_h1" else None}
            summary.append(row)
            print(f"{pp:>2} {schedule + (f' v={vpp}' if vpp > 1 else ''):<17} "
                  f"{row['step_time_s_median']:>8.3f} ({min(st):.3f}-{max(st):.3f}) {row['step_time_vs_1f1b']:>8.3f} "
                  f"{row['bubble_median']:>8.3f} ({min(bu):.3f}-{max(bu):.3f}) {row['bubble_formula']:>8.3f} "
                  f"{row['alive_first_stage']:>6.0f}/{row['alive_last_stage']:<7.0f} {xs[0]['loss_last']:>13.6f} "
                  f"{row['forward_s_per_stage_median'][0]:>6.3f}/{row['backward_s_per_stage_median'][0]:.3f}/"
                  + (f"{row['weight_backward_s_per_stage_median'][0]:.3f}" if schedule == "zb_h1" else "-"))
    print("-" * len(head))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {time.time() - started:.0f} s")
    shutil.rmtree(work, ignore_errors=True)
    if args.quick:
        return
    result = {"bench": "pipeline_schedules", "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "model": "configs/demo.json with 8 decoder layers", "micro_batches": m, "micro_batch": "2 x 128 tokens",
              "threads_per_rank": 1, "precision": "fp32", "steps_per_run": steps, "steps_skipped": skip,
              "repeats": repeats, "load_average_before": list(load_before), "load_average_after": list(load_after),
              "results": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
