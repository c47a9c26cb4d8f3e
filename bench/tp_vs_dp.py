#!/usr/bin/env python3
"""Tensor parallelism against data parallelism and ZeRO-3 on 2 ranks: speed and memory per rank.

Run with the virtual environment's python (/opt/shardlm/venv, made by scripts/setup.sh), from anywhere:

    /opt/shardlm/venv/bin/python bench/tp_vs_dp.py            # full run, ~6 minutes
    /opt/shardlm/venv/bin/python bench/tp_vs_dp.py --quick    # smoke run, about a minute

Four layouts of the same 2 ranks x 1 thread train the same model on the same global batch
(micro-batch B per data-parallel rank; tp=2 has one data-parallel rank, so it gets 2B sequences
per micro-step and the same tokens per step):

  dp=2          DDP, every rank holds the whole model and optimizer
  zero3         ZeRO-3 over 2 ranks: parameters, gradients and optimizer state sharded
  tp=2          Megatron tensor parallelism, dp=1
  tp=2 + SP     with sequence parallelism

Printed per layout: tokens/s (median over the measured steps of every repeat, interleaved
repeats, warm-up dropped) and its ratio to dp=2; model-state bytes per rank and activation bytes
per rank (memory.json: held after forward, and the resident-set growth over forward + backward);
bytes per step on the data- and tensor-parallel groups. Only ratios measured in one invocation
mean anything on this shared 2-core machine.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Config, add_model_args, add_run_length_args, add_shardlm_arg, clean_env,  # noqa: E402
                    fresh_dir, parse_run_length_args, read_metrics, run_checked)

import json  # noqa: E402

FULL = dict(steps=12, warmup=3, repeats=2, micro_batch=4, seq_len=256, model_set=[])
QUICK = dict(steps=4, warmup=1, repeats=1, micro_batch=2, seq_len=128,
             model_set=["num_hidden_layers=2", "hidden_size=192", "intermediate_size=512"])
LAYOUTS = [
    ("dp2", "dp=2 (DDP)", lambda b: [f"--train_micro_batch_size_per_gpu={b}"]),
    ("zero3", "dp=2 ZeRO-3", lambda b: [f"--train_micro_batch_size_per_gpu={b}", "--zero_optimization.stage=3"]),
    ("tp2", "tp=2", lambda b: [f"--train_micro_batch_size_per_gpu={2 * b}", "--parallelism.tensor_parallel=2"]),
    ("tp2sp", "tp=2 + sequence parallel",
     lambda b: [f"--train_micro_batch_size_per_gpu={2 * b}", "--parallelism.tensor_parallel=2",
                "--parallelism.sequence_parallel=true"]),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL, QUICK)
    add_model_args(p)
    add_shardlm_arg(p)
    p.add_argument("--work-dir", type=Path, help="keep every run's output here (default: a temp dir, deleted)")
    args = parse_run_length_args(p, FULL, QUICK)
    if args.model_set is None:
        args.model_set = []
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="shardlm_tp_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    binary = work / "shardlm"
    shutil.copy2(args.shardlm, binary)

    memory = {}

    def runner(key, extra):
        def run(out_dir):
            out_dir = fresh_dir(out_dir)
            cmd = [str(binary), "train", "--config", str(args.config), "--nproc", "2", f"--steps={args.steps}",
                   f"--out_dir={out_dir}", "--threads=1", "--resume=false", f"--log_interval={args.steps}",
                   "--gradient_accumulation_steps=1", f"--data.seq_len={args.seq_len}", "--data.val=",
                   f"--model.preset={args.model_preset}", *[f"--model.{kv}" for kv in args.model_set], *extra]
            run_checked(cmd, clean_env(1), f"shardlm {key}")
            memory.setdefault(key, json.loads((out_dir / "memory.json").read_text()))
            return read_metrics(out_dir / "metrics.jsonl")
        return run

    configs = [Config(key, label, runner(key, make(args.micro_batch))) for key, label, make in LAYOUTS]
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for c in order:
            c.repeats.append(c.run(work / f"{c.key}_{rep}"))
    stats = {c.key: c.stats(args.warmup) for c in configs}

    print(f"\n== tp=2 vs dp=2 vs ZeRO-3: {args.model_preset} {' '.join(args.model_set)}, "
          f"{2 * args.micro_batch} x {args.seq_len} tokens per step, 2 ranks x 1 thread ==")
    head = (f"{'layout':<26} {'tok/s':>8} {'vs dp=2':>8} {'states MB':>10} {'act held MB':>12} "
            f"{'act peak MB':>12} {'dp comm MB':>11} {'tp comm MB':>11}")
    print(head)
    print("-" * len(head))
    for c in configs:
        st, m = stats[c.key], memory[c.key]
        rows = [r for rows in c.measured(args.warmup) for r in rows]

        def comm(prefix):
            per_step = [sum(v for k, v in r.items() if k.startswith(prefix) and k.endswith("_bytes")
                            and (prefix == "comm_tp_" or not k.startswith("comm_tp_"))) for r in rows]
            return statistics.median(per_step) / 1e6 if per_step else 0.0

        print(f"{c.label:<26} {st['median']:>8.0f} {st['median'] / stats['dp2']['median']:>7.2f}x "
              f"{m['total_model_states'] / 1e6:>10.1f} {m['activations_held'] / 1e6:>12.1f} "
              f"{m['activations_measured'] / 1e6:>12.1f} {comm('comm_'):>11.1f} {comm('comm_tp_'):>11.1f}")
    print("-" * len(head))
    print("states: model-state bytes per rank (params + grads + optimizer); act held: bytes in use after the first")
    print("forward (what backward reads); act peak: resident-set growth over that forward + backward (rank 0).")
    print("comm MB: bytes this rank contributed per step, data-parallel group and tensor-parallel group.")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
