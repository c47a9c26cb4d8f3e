#!/usr/bin/env python3
"""Compact optimizer states (optimizer.state_precision) on the 200-step demo: final loss and the
Adam moments' bytes per rank against fp32 AdamW's.

    /opt/shardlm/venv/bin/python bench/compact_states.py              # fp32, bf16, 8bit: ~3 x 3-6 min
    /opt/shardlm/venv/bin/python bench/compact_states.py --steps 20   # smoke run
    /opt/shardlm/venv/bin/python bench/compact_states.py --states fp32 8bit --zero 2

Each run is `shardlm train --config configs/demo.json --nproc 2 --resume=false` (the demo as
scripts/demo.sh trains it) with one optimizer.state_precision; the numbers are read from the run's
metrics.jsonl (loss of the last step, the last validation loss) and memory.json (optimizer_states:
what the strategy holds, which the planner predicts exactly). Results are printed and written to
--out as JSON (bench/compact_states.json is the checked-in measurement). The issue's bars: 8-bit
moment bytes <= 0.3x fp32's, final loss within 1% of fp32's.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--states", nargs="+", default=["fp32", "bf16", "8bit"])
    p.add_argument("--zero", type=int, default=0, help="zero_optimization.stage (default 0, the demo's)")
    p.add_argument("--work-dir", default="/tmp/shardlm_compact_states")
    p.add_argument("--out", default=str(Path(REPO) / "bench" / "compact_states.json"))
    p.add_argument("--shardlm", default=str(Path(REPO) / "build" / "shardlm"))
    args = p.parse_args()

    results = {}
    for states in args.states:
        out_dir = fresh_dir(Path(args.work_dir) / f"{states}_zero{args.zero}")
        cmd = [args.shardlm, "train", "--config", "configs/demo.json", "--nproc", "2", "--resume=false",
               f"--steps={args.steps}", f"--out_dir={out_dir}", f"--optimizer.state_precision={states}",
               f"--zero_optimization.stage={args.zero}", "--checkpoint_interval=0"]
        t0 = time.time()
        run_checked(cmd, clean_env(None), f"demo with optimizer.state_precision={states}")
        seconds = time.time() - t0
        rows = read_metrics(out_dir / "metrics.jsonl")
        train = [r for r in rows if "loss" in r]
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        memory = json.loads((out_dir / "memory.json").read_text())
        results[states] = {"final_loss": train[-1]["loss"], "final_step": train[-1]["step"],
                           "first_loss": train[0]["loss"], "val_loss": val[-1] if val else None,
                           "optimizer_states_bytes": memory["optimizer_states"], "seconds": round(seconds, 1)}
        print(f"{states:>5}: loss {train[0]['loss']:.4f} -> {train[-1]['loss']:.4f} (step {train[-1]['step']}), "
              f"val {results[states]['val_loss']}, optimizer states {memory['optimizer_states']} B, {seconds:.0f} s",
              flush=True)
    if "fp32" in results:
        ref = results["fp32"]
        for states, r in results.items():
            r["loss_vs_fp32"] = r["final_loss"] / ref["final_loss"] - 1
            r["bytes_vs_fp32"] = r["optimizer_states_bytes"] / ref["optimizer_states_bytes"]
            print(f"{states:>5}: final loss {100 * r['loss_vs_fp32']:+.2f}% vs fp32, moment bytes "
                  f"{r['bytes_vs_fp32']:.3f}x fp32's")
    record = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "zero_stage": args.zero,
              "cpu": os.popen("lscpu | grep 'Model name'").read().strip(), "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
