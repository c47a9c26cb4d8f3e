#!/usr/bin/env python3
"""What shardlm's debug checks cost: tokens/s with and without them, measured side by side.

    /opt/shardlm/venv/bin/python bench/debug_checks.py            # full run, ~5 minutes
    /opt/shardlm/venv/bin/python bench/debug_checks.py --quick    # smoke run, under a minute

2 MPI ranks x 1 thread, the demo model, DDP (zero_optimization.stage=0) and ZeRO-3 (the most
collectives per step), each run plain, with debug.consistency_interval=1 (the checksum exchange on
every step: the worst case; interval k costs about 1/k of it) and with debug.check_collectives=true
(a signature all-gather before every collective). Runs are interleaved (every repeat runs each
configuration once) and the first --warmup steps of each are dropped. The machine is shared, so
tokens/s ratios are noisy; the checks' own seconds per step (from metrics.jsonl) are printed too. Helpers come from bench/common.py.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Config, add_model_args, add_run_length_args, add_shardlm_arg, clean_env, fresh_dir,  # noqa: E402
                    parse_run_length_args, read_metrics, run_checked, shardlm_overrides)

NPROC = 2
FULL_DEFAULTS = dict(steps=12, warmup=2, repeats=2, micro_batch=8, seq_len=128, model_set=[])
QUICK_DEFAULTS = dict(steps=3, warmup=1, repeats=1, micro_batch=4, seq_len=64,
                      model_set=["num_hidden_layers=2", "hidden_size=192", "intermediate_size=512"])
CHECKS = {"off": [], "consistency_interval=1": ["--debug.consistency_interval=1"],
          "check_collectives": ["--debug.check_collectives=true"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)
    add_model_args(p)
    add_shardlm_arg(p)
    args = parse_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)
    if args.model_set is None:
        args.model_set = (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS)["model_set"]
    work = Path(tempfile.mkdtemp(prefix="shardlm_debug_checks_"))
    binary = work / "shardlm"
    shutil.copy2(args.shardlm, binary)  # a rebuild during the run cannot mix two builds

    def runner(stage, check):
        def run(out_dir):
            out = fresh_dir(out_dir)
            cmd = [str(binary), "train", "--config", str(args.config), "--nproc", str(NPROC), f"--steps={args.steps}",
                   f"--out_dir={out}", "--threads=1", "--resume=false", f"--log_interval={args.steps}",
                   f"--zero_optimization.stage={stage}", *shardlm_overrides(args), *CHECKS[check]]
            run_checked(cmd, clean_env(1), f"shardlm stage {stage} {check}")
            return read_metrics(out / "metrics.jsonl")
        return run

    configs = [Config(f"s{stage}_{check}", f"{'DDP' if stage == 0 else 'ZeRO-3'}, {check}", runner(stage, check))
               for stage in (0, 3) for check in CHECKS]
    try:
        for rep in range(args.repeats):
            for i in range(len(configs)):
                c = configs[(i + rep) % len(configs)]
                c.repeats.append(c.run(work / c.key))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"model {args.model_preset} {' '.join(args.model_set)} | {NPROC} ranks x 1 thread | micro-batch "
          f"{args.micro_batch} x seq {args.seq_len} | {args.steps} steps, first {args.warmup} dropped | "
          f"{args.repeats} repeat(s), interleaved")
    head = (f"{'config':<36} {'tok/s median':>12} {'step s':>7} {'repeat medians':>18} {'vs off':>7} "
            f"{'check s/step':>12} {'share':>6}")
    print(head)
    print("-" * len(head))
    stats = {c.key: c.stats(args.warmup) for c in configs}
    for c in configs:
        st, base = stats[c.key], stats[c.key.split("_")[0] + "_off"]
        reps = ", ".join(f"{m:.0f}" for m in st["repeat_medians"])
        # The checks' own time, measured inside each step: robust to the machine's load, unlike
        # the tokens/s ratio.
        check = [r.get("debug_consistency_s", 0) + r.get("comm_collective_checks_wait_s", 0)
                 for rows in c.measured(args.warmup) for r in rows]
        share = [x / r["step_time_s"] for x, r in zip(check, (r for rows in c.measured(args.warmup) for r in rows))]
        print(f"{c.label:<36} {st['median']:>12.0f} {st['step_s']:>7.3f} {reps:>18} "
              f"{st['median'] / base['median']:>6.3f}x {statistics.median(check):>12.4f} "
              f"{100 * statistics.median(share):>5.1f}%")
    print("-" * len(head))
    print("check s/step: debug_consistency_s (checksums + exchanges) or comm_collective_checks_wait_s (signature "
          "all-gathers); share: of the step time")


if __name__ == "__main__":
    main()
