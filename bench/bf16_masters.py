#!/usr/bin/env python3
"""bf16 master weights (optimizer.master_precision "bf16", src/optim/master_format.h) on the 200-step
demo in bf16: fp32 masters against bf16 masters rounded by Kahan summation, stochastic rounding and
round-to-nearest; final train/validation loss and the model-state bytes per rank.

    /opt/shardlm/venv/bin/python bench/bf16_masters.py              # 4 runs, ~2-4 min each on 2 cores
    /opt/shardlm/venv/bin/python bench/bf16_masters.py --steps 20   # smoke run
    /opt/shardlm/venv/bin/python bench/bf16_masters.py --masters fp32 kahan --zero 1

Each run is `shardlm train --config configs/demo.json --nproc 2 --resume=false --bf16.enabled=true`
with one master format; the numbers come from the run's metrics.jsonl (the last step's loss, the mean
of the last 10 logged losses, the last validation loss) and memory.json (master_params and
optimizer_states, which the planner predicts exactly). Results are printed and written to --out
(bench/results/bf16_masters.json is the checked-in measurement).
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
    p.add_argument("--masters", nargs="+", default=["fp32", "kahan", "stochastic", "nearest"])
    p.add_argument("--zero", type=int, default=0, help="zero_optimization.stage (default 0, the demo's)")
    p.add_argument("--work-dir", default="/tmp/shardlm_bf16_masters")
    p.add_argument("--out", default=str(Path(REPO) / "bench" / "results" / "bf16_masters.json"))
    p.add_argument("--shardlm", default=str(Path(REPO) / "build" / "shardlm"))
    args = p.parse_args()

    results = {}
    for masters in args.masters:
        out_dir = fresh_dir(Path(args.work_dir) / f"{masters}_zero{args.zero}")
        keys = (["--optimizer.master_precision=fp32"] if masters == "fp32" else
                ["--optimizer.master_precision=bf16", f"--optimizer.master_rounding={masters}"])
        cmd = [args.shardlm, "train", "--config", "configs/demo.json", "--nproc", "2", "--resume=false",
               "--bf16.enabled=true", f"--steps={args.steps}", f"--out_dir={out_dir}",
               f"--zero_optimization.stage={args.zero}", "--checkpoint_interval=0"] + keys
        t0 = time.time()
        run_checked(cmd, clean_env(None), f"demo with bf16 masters {masters}")
        seconds = time.time() - t0
        rows = read_metrics(out_dir / "metrics.jsonl")
        train = [r for r in rows if "loss" in r]
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        memory = json.loads((out_dir / "memory.json").read_text())
        states = memory["compute_params"] + memory["gradients"] + memory["master_params"] + memory["optimizer_states"]
        results[masters] = {"final_loss": train[-1]["loss"], "final_step": train[-1]["step"],
                            "last10_mean_loss": sum(r["loss"] for r in train[-10:]) / len(train[-10:]),
                            "first_loss": train[0]["loss"], "val_loss": val[-1] if val else None,
                            "master_params_bytes": memory["master_params"],
                            "optimizer_states_bytes": memory["optimizer_states"], "model_states_bytes": states,
                            "seconds": round(seconds, 1)}
        print(f"{masters:>10}: loss {train[0]['loss']:.4f} -> {train[-1]['loss']:.4f} (step {train[-1]['step']}), "
              f"val {results[masters]['val_loss']}, masters {memory['master_params']} B, optimizer states "
              f"{memory['optimizer_states']} B, model states {states} B, {seconds:.0f} s", flush=True)
    if "fp32" in results:
        ref = results["fp32"]
        for masters, r in results.items():
            r["loss_vs_fp32"] = r["final_loss"] / ref["final_loss"] - 1
            if r["val_loss"] is not None and ref["val_loss"] is not None:
                r["val_vs_fp32"] = r["val_loss"] / ref["val_loss"] - 1
            r["bytes_saved"] = ref["model_states_bytes"] - r["model_states_bytes"]
            r["bytes_vs_fp32"] = r["model_states_bytes"] / ref["model_states_bytes"]
            print(f"{masters:>10}: final loss {100 * r['loss_vs_fp32']:+.2f}%, val "
                  f"{100 * r.get('val_vs_fp32', float('nan')):+.2f}% vs fp32 masters; model states "
                  f"{r['bytes_vs_fp32']:.3f}x ({r['bytes_saved']} B saved per rank)")
    record = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "zero_stage": args.zero,
              "cpu": os.popen("lscpu | grep 'Model name'").read().strip(),
              "load_average_before": os.getloadavg()[0], "results": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
