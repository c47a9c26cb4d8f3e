#!/usr/bin/env python3
"""GPipe against 1F1B: the measured bubble against (p-1)/(m+p-1), and activation memory per stage.

Run with the virtual environment's python (/opt/shardlm/venv, made by scripts/setup.sh), from anywhere:

    /opt/shardlm/venv/bin/python bench/pipeline_schedules.py            # ~3 minutes
    /opt/shardlm/venv/bin/python bench/pipeline_schedules.py --quick    # under a minute

2 ranks x 1 thread = 2 pipeline stages of the demo model (6 layers: embedding + 3 layers | 3 layers +
head), micro-batch 2 x 128 tokens, m = 2, 4, 8 micro-batches per step, both schedules. Per run, the
median over the measured steps of what the trainer records per stage (metrics.jsonl):
  bubble        1 - (time computing forwards and backwards) / (time from the first forward to the
                last backward), each stage; and their mean, against the formula for equal stages;
  act peak      activation bytes held after a forward, at most (heap in use above the step's start);
  alive         most micro-batches whose activations were alive at once (GPipe: m; 1F1B: p - s).
The stages are not equal: the last runs the head (a 4096-wide vocabulary product and the loss), so
the first waits for it and its bubble exceeds the formula while the last's falls below it.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 steps per run, m = 2 and 8 only")
    p.add_argument("--shardlm", type=Path, default=REPO / "build" / "shardlm")
    args = p.parse_args()
    steps, warmup = (3, 1) if args.quick else (6, 2)
    micro = (2, 8) if args.quick else (2, 4, 8)
    work = Path(tempfile.mkdtemp(prefix="shardlm_pp_bench_"))
    binary = work / "shardlm"
    shutil.copy2(args.shardlm, binary)
    print(f"\n== pipeline schedules: demo model, 2 stages (2 ranks x 1 thread), micro-batch 2 x 128, {steps} steps ==")
    head = (f"{'schedule':<8} {'m':>3} {'tok/s':>7} {'bubble s0':>10} {'bubble s1':>10} {'mean':>6} {'formula':>8} "
            f"{'act peak s0 MB':>15} {'act peak s1 MB':>15} {'alive s0/s1':>12}")
    print(head)
    print("-" * len(head))
    for m in micro:
        for schedule in ("gpipe", "1f1b"):
            out = fresh_dir(work / f"{schedule}_{m}")
            cmd = [str(binary), "train", "--config", str(REPO / "configs" / "demo.json"), "--nproc", "2",
                   "--threads=1", f"--steps={steps}", f"--out_dir={out}", "--resume=false", "--data.val=",
                   "--parallelism.pipeline_parallel=2", f"--parallelism.pipeline_schedule={schedule}",
                   f"--gradient_accumulation_steps={m}", "--train_micro_batch_size_per_gpu=2", "--data.seq_len=128",
                   f"--log_interval={steps}"]
            run_checked(cmd, clean_env(1), f"shardlm {schedule} m={m}")
            rows = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] > warmup]

            def med(key):
                return statistics.median(r[key] for r in rows)

            print(f"{schedule:<8} {m:>3} {med('tokens_per_s'):>7.0f} {med('pipeline_bubble.stage0'):>10.3f} "
                  f"{med('pipeline_bubble.stage1'):>10.3f} {med('pipeline_bubble'):>6.3f} "
                  f"{rows[0]['pipeline_bubble_formula']:>8.3f} {med('pipeline_activation_peak.stage0') / 1e6:>15.1f} "
                  f"{med('pipeline_activation_peak.stage1') / 1e6:>15.1f} "
                  f"{med('pipeline_alive_micro_batches.stage0'):>5.0f}/{med('pipeline_alive_micro_batches.stage1'):<6.0f}")
    print("-" * len(head))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
