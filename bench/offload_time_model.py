#!/usr/bin/env python3
"""The time model's NVMe offload prices against measured steps (issues 24 and 26): predicted and
measured step time of the demo model at 1 rank x 1 thread with optimizer-state offload (ZeRO-1) and
parameter offload (ZeRO-3, max_in_cpu 0), fp32 and bf16, each beside the same run without offload.

Why: `plan --search` ranks offloaded layouts by the time model's price of their disk I/O
(src/plan/time_model.cpp add_offload), priced at the bandwidth `shardlm bench machine --disk DIR`
measures. That price is only useful if the trainer then takes about as long:

    /opt/shardlm/venv/bin/python bench/offload_time_model.py [--shardlm PATH] [--repeats 3]
        [--out bench/results/offload_time_model.json]

1. `shardlm bench machine --threads 1 --model demo --micro-batch 8 --seq-len 128 --no-grid --disk NVME`
   (the demo's own product shapes, the disk under the offload directory);
2. per offload and precision, bench/offload.py's comparison (runs with and without offload
   alternating, `repeats` times each; median step_time_s and time_optimizer_s after the first step;
   without its page-cache sampler, whose scans would slow the offloaded runs);
3. `shardlm plan --machine machine.json --json` for the same layouts (with --offload-optimizer nvme /
   --offload-param nvme --offload-param-max-in-cpu 0);
4. predicted / measured per layout, and for what offload adds to the step; the load average before and
   after (the machine is shared: timing needs it quiet; the numbers say how quiet it was).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import offload  # noqa: E402  (bench/offload.py: the measured side)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
PRECISIONS = {"fp32": [], "bf16": ["--bf16.enabled=true"]}
OFFLOAD_FLAGS = {"states": ["--offload-optimizer", "nvme"],
                 "params": ["--offload-param", "nvme", "--offload-param-max-in-cpu", "0"]}


# Timing only: bench/offload.py samples the offload files' page cache every 20 ms (mincore over every page
# of them, in this process); on 2 cores that scan slows the offloaded runs alone. Not sampled here.
offload.cached_bytes = lambda path: 0


def predicted(shardlm, machine, precision, stage, flags):
    out = subprocess.run([shardlm, "plan", "--model", "demo", "--devices", "1", "--micro-batch", "8", "--seq-len", "128",
                          "--precision", precision, "--zero-stage", str(stage), "--machine", machine, "--json", *flags],
                         check=True, capture_output=True, text=True, env=ENV).stdout
    return json.loads(out)["predicted"]["stages"][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", default=os.path.join(REPO, "build", "shardlm"))
    ap.add_argument("--nvme", default=None, help="offload directory (default: a fresh one under /var/tmp)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--kinds", default="states,params")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    nvme = args.nvme or tempfile.mkdtemp(prefix="shardlm_offload_", dir="/var/tmp")
    machine_dir = tempfile.TemporaryDirectory(prefix="shardlm_machine_")  # removed on exit
    machine = os.path.join(machine_dir.name, "machine.json")
    results = {"model": "demo", "ranks": 1, "threads": 1, "micro_batch": 8, "seq_len": 128, "steps": args.steps,
               "repeats": args.repeats, "load_average_before": os.getloadavg(), "layouts": {}}
    subprocess.run([args.shardlm, "bench", "machine", "--threads", "1", "--model", "demo", "--micro-batch", "8",
                    "--seq-len", "128", "--no-grid", "--disk", nvme, "--out", machine], check=True, env=ENV,
                   stdout=subprocess.DEVNULL)
    with open(machine) as f:
        results["machine"] = json.load(f)
    worst = 0.0
    for what in args.kinds.split(","):
        stage = offload.KINDS[what][0]
        for name, extra in PRECISIONS.items():
            m = offload.compare(args, nvme, what, name, extra)
            plain = predicted(args.shardlm, machine, name, stage, [])
            off = predicted(args.shardlm, machine, name, stage, OFFLOAD_FLAGS[what])
            row = {
                "zero_stage": stage,
                "offloaded_bytes": m["offloaded_bytes"],
                "measured_step_without_s": m["step_time_without_s"], "predicted_step_without_s": plain["step_s"],
                "measured_step_with_s": m["step_time_with_s"], "predicted_step_with_s": off["step_s"],
                "measured_optimizer_with_s": m["optimizer_time_with_s"], "predicted_optimizer_with_s": off["optimizer_s"],
                "measured_offload_adds_s": m["step_time_with_s"] - m["step_time_without_s"],
                "predicted_offload_adds_s": off["offload_exposed_s"],
                "predicted_offload_io_s": off["offload_io_s"],
                "losses_bit_identical": m["losses_bit_identical"],
                "io_path": m["io_path"],
            }
            row["ratio_with"] = row["predicted_step_with_s"] / row["measured_step_with_s"]
            row["ratio_without"] = row["predicted_step_without_s"] / row["measured_step_without_s"]
            worst = max(worst, abs(row["ratio_with"] - 1))
            results["layouts"][f"{what}_{name}"] = row
            print(f"{what} {name} (ZeRO-{stage}, {m['offloaded_bytes'] / 1e6:.0f} MB on disk): step with offload "
                  f"predicted {row['predicted_step_with_s'] * 1e3:.0f} ms, measured {row['measured_step_with_s'] * 1e3:.0f} "
                  f"ms (x{row['ratio_with']:.2f}); without {row['predicted_step_without_s'] * 1e3:.0f} / "
                  f"{row['measured_step_without_s'] * 1e3:.0f} ms (x{row['ratio_without']:.2f}); offload adds "
                  f"{row['predicted_offload_adds_s'] * 1e3:.0f} predicted, {row['measured_offload_adds_s'] * 1e3:.0f} ms "
                  f"measured; optimizer {row['predicted_optimizer_with_s'] * 1e3:.0f} / "
                  f"{row['measured_optimizer_with_s'] * 1e3:.0f} ms", flush=True)
    results["load_average_after"] = os.getloadavg()
    results["worst_step_with_offload_error"] = worst
    results["within_15_percent"] = worst <= 0.15
    d = results["machine"]["disk"]
    print("disk: " + ", ".join(f"{r['block_bytes'] >> 10} KiB write {r['disk_write_bytes_per_s'] / 1e6:.0f} read "
                               f"{r['disk_read_bytes_per_s'] / 1e6:.0f} MB/s" for r in d) +
          f"; worst |predicted/measured - 1| with offload {100 * worst:.1f}%; load average "
          f"{results['load_average_before'][0]:.2f} before, {results['load_average_after'][0]:.2f} after")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
