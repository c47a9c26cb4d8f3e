#!/usr/bin/env python3
"""Context parallelism's memory and speed (issue 43), measured beside the planner's prediction.

Why: context parallelism exists to train sequences whose activations do not fit one rank. Its claims
are numbers - activations per rank at cp 4 against cp 1, the plan against the measurement, a
device_memory the plan refuses at cp 1 and a cp 4 run trains within, the speed of cp 2 on two ranks
against one rank, the two ranks' balance and the time model - and this script measures them:

    /opt/shardlm/venv/bin/python bench/context_parallel.py --json bench/results/context_parallel.json
    /opt/shardlm/venv/bin/python bench/context_parallel.py --part memory   # or speed

memory: the demo model's shape (hidden 384, 6 heads, 2 KV heads, vocabulary 4096) with --layers
  decoder layers, one sequence of --memory-seq tokens (16384), fp32, fused attention (the ring on the
  flash kernel), one step at cp 1 (1 rank) and cp 4 (4 ranks, p2p): memory.json's activations_held
  (allocator bytes held after the first forward, what backward reads) of rank 0 against plan.json's
  activations; then a device_memory between the two plans' totals: the trainer must refuse cp 1 and
  train cp 4, each rank's peak resident set (memory.json's measured peak) within that limit.
speed: one sequence of --speed-seq tokens (8192), cp 2 on 2 ranks x 1 thread against cp 1 on 1 rank x
  1 thread, --repeats runs of --steps steps each, interleaved, median step time after the first step;
  each rank's attention compute seconds (SHARDLM_CP_TIMING=1: the ring's kernels, forward and
  backward) and the time model's step (plan --machine, from `shardlm bench machine`).
The machine is shared and has 2 cores: the load average before and after is recorded.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, SHARDLM  # noqa: E402

def env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
                SHARDLM_CP_TIMING="1")


def run(cmd, timeout=5400, check=True):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env())
    if check and p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def train(args, work, name, seq, cp, steps, extra=(), check=True):
    """One `shardlm train` of the demo model with args.layers layers, one sequence of `seq` tokens per
    micro-step on each of cp ranks (one data-parallel rank): its out_dir and the finished process."""
    out_dir = os.path.join(work, name)
    cmd = [SHARDLM, "train", "--config", REPO / "configs" / "demo.json", "--nproc", cp, "--threads=1",
           f"--steps={steps}", "--data.val=", f"--out_dir={out_dir}", "--resume=false", "--log_interval=1",
           "--checkpoint_interval=0", "--train_micro_batch_size_per_gpu=1", "--gradient_accumulation_steps=1",
           f"--data.seq_len={seq}", f"--model.num_hidden_layers={args.layers}",
           f"--model.max_position_embeddings={seq}", "--attn_implementation=sdpa",
           f"--parallelism.context_parallel={cp}", "--scheduler.type=constant", *extra]
    return out_dir, run(cmd, check=check)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def attention_seconds(log):
    """Each rank's `[cp timing] rank R: attention compute S s` line (SHARDLM_CP_TIMING)."""
    pattern = r"\[cp timing\] rank (\d+): attention compute ([0-9.e+-]+) s"
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, log)}


def memory_part(args, work):
    out = {"model": f"demo shape (hidden 384, 6 heads, 2 KV heads, vocabulary 4096), {args.layers} layers",
           "seq_len": args.memory_seq, "runs": {}}
    for cp in (1, 4):
        d, _ = train(args, work, f"mem_cp{cp}", args.memory_seq, cp, 1)
        measured = read_json(os.path.join(d, "memory.json"))
        stage = read_json(os.path.join(d, "plan.json"))["stages"][0]
        row = metrics(d)[0]
        out["runs"][f"cp{cp}"] = {
            "activations_held": measured["activations_held"], "activations_measured": measured["activations_measured"],
            "planned_activations": stage["activations"], "planned_total": stage["total"],
            "plan_over_measured": stage["activations"] / measured["activations_held"],
            "model_states": measured["total_model_states"], "peak_rss_max": row.get("memory_peak_rss_max"),
            "step_time_s": row.get("step_time_s"), "comm_cp_send_bytes": row.get("comm_cp_send_bytes"),
            "planned_cp_p2p": stage["comm_bytes_per_step"].get("cp_p2p")}
        print(f"cp {cp}: activations held {measured['activations_held'] / 2**20:.1f} MiB, planned "
              f"{stage['activations'] / 2**20:.1f} MiB ({stage['activations'] / measured['activations_held']:.3f}x); "
              f"plan total {stage['total'] / 2**20:.1f} MiB", flush=True)
    r = out["runs"]
    out["cp4_over_cp1"] = r["cp4"]["activations_held"] / r["cp1"]["activations_held"]
    # A per-rank device_memory between the two plans' totals: refused at cp 1, trained at cp 4. What the
    # plan counts, measured: model states + the first micro-batch's resident growth (activations and
    # backward's temporaries); the peak RSS adds the process itself (libtorch, MPI), which no plan counts.
    limit = int((r["cp1"]["planned_total"] + r["cp4"]["planned_total"]) / 2)
    _, refused = train(args, work, "limit_cp1", args.memory_seq, 1, 1, [f"--device_memory={limit}"], check=False)
    trained, _ = train(args, work, "limit_cp4", args.memory_seq, 4, 1, [f"--device_memory={limit}"])
    m = read_json(os.path.join(trained, "memory.json"))
    log = refused.stdout + refused.stderr
    counted = m["total_model_states"] + m["activations_measured"]
    out["device_memory_demo"] = {
        "device_memory": limit, "cp1_refused": refused.returncode != 0 and "does not fit device_memory" in log,
        "cp1_fix": next((line for line in log.splitlines() if "smallest change that fits" in line), None),
        "cp4_trained": True, "cp4_model_states_plus_measured_growth": counted, "cp4_within": counted <= limit,
        "cp4_peak_rss_max": metrics(trained)[0].get("memory_peak_rss_max")}
    print(f"cp4/cp1 activations {out['cp4_over_cp1']:.3f}; device_memory {limit / 2**20:.0f} MiB: cp 1 refused "
          f"{out['device_memory_demo']['cp1_refused']}, cp 4 trained with {counted / 2**20:.0f} MiB counted", flush=True)
    return out


def speed_part(args, work):
    machine = os.path.join(work, "machine.json")
    run([SHARDLM, "bench", "machine", "--nproc", "2", "--threads", "1", "--model", "demo", "--micro-batch", 1,
         "--seq-len", args.speed_seq, "--dtypes", "fp32", "--disk", "none", "--out", machine])
    steps = {1: [], 2: []}
    attention = {1: [], 2: []}
    predicted = {}
    for rep in range(args.repeats):  # interleaved: a busy minute touches both alike
        for cp in (1, 2):
            d, p = train(args, work, f"speed_cp{cp}_{rep}", args.speed_seq, cp, args.steps, [f"--machine_profile={machine}"])
            times = [r["step_time_s"] for r in metrics(d) if "step_time_s" in r][1:]
            steps[cp].append(statistics.median(times))
            attention[cp].append(attention_seconds(p.stdout + p.stderr))
            predicted[cp] = read_json(os.path.join(d, "plan.json"))["predicted"]
            print(f"repeat {rep + 1}/{args.repeats} cp {cp}: {steps[cp][-1]:.2f} s/step (predicted "
                  f"{predicted[cp]['step_s']:.2f}), attention {attention[cp][-1]}, load {os.getloadavg()[0]:.1f}",
                  flush=True)
    med = {cp: statistics.median(steps[cp]) for cp in (1, 2)}
    balance = [max(a.values()) / min(a.values()) - 1 for a in attention[2] if len(a) == 2 and min(a.values()) > 0]
    out = {"seq_len": args.speed_seq, "steps_per_run": args.steps, "repeats": args.repeats, "step_s": steps,
           "median_step_s": med, "tokens_per_s_ratio_cp2_over_cp1": med[1] / med[2],
           "attention_kernel_s_per_rank": attention, "attention_imbalance": balance,
           "attention_imbalance_median": statistics.median(balance) if balance else None,
           "predicted": predicted, "measured_over_predicted": {cp: med[cp] / predicted[cp]["step_s"] for cp in (1, 2)}}
    print(f"cp 2 on 2 ranks: {out['tokens_per_s_ratio_cp2_over_cp1']:.2f}x the tokens/s of one rank; attention "
          f"imbalance {out['attention_imbalance_median']}; measured/predicted {out['measured_over_predicted']}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["memory", "speed", "all"], default="all")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the demo shape (default 2)")
    ap.add_argument("--memory-seq", type=int, default=16384)
    ap.add_argument("--speed-seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shardlm_cp_bench_")
    t0, load_before = time.time(), os.getloadavg()
    result = {"load_before": load_before, "cpu": os.cpu_count()}
    if args.part in ("memory", "all"):
        result["memory"] = memory_part(args, work)
    if args.part in ("speed", "all"):
        result["speed"] = speed_part(args, work)
    result.update({"load_after": os.getloadavg(), "seconds": time.time() - t0})
    print(f"load average {load_before[0]:.2f} -> {result['load_after'][0]:.2f}, {result['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
