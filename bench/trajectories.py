"""Exact training trajectories of a fixed set of layouts, to prove a restructuring changed nothing.

Why this exists: a refactor of the step path (schedules, loss scaling, the trainer loop) must leave
every layout's numbers bit for bit as they were. This script runs one fixed set - DDP, ZeRO 0-3 x
fp32/bf16/fp16, ZeRO's placements (stage 3 fully sharded, host and NVMe optimizer states, NVMe
parameters, the GPU's host-apart layouts run on the CPU, small buckets, no overlap, hybrid sharding),
tensor parallel, pipeline (1F1B and GPipe), dp x tp x pp, and a resume - on the tiny model and
writes each run's per-step loss, grad norm and validation loss as exact hex floats:

    python bench/trajectories.py --out before.json          # with the old binary
    python bench/trajectories.py --out after.json           # with the new one
    python bench/trajectories.py --compare before.json after.json

--only REGEX runs the layouts whose name it finds (e.g. --only zero1), for a change that touches only those.

--compare prints each run's verdict and exits non-zero when any number differs.
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SHARDLM, clean_env, fresh_dir, read_metrics, run_checked  # noqa: E402

BASE = ["--config", "configs/tiny.json", "--steps=6", "--eval_interval=3", "--threads=1", "--log_interval=100",
        "--gradient_accumulation_steps=2", "--train_micro_batch_size_per_gpu=2"]
LAYOUTS = {"ddp2": (2, [])}
for stage in range(4):
    for precision, flags in (("fp32", []), ("bf16", ["--bf16.enabled=true"]), ("fp16", ["--fp16.enabled=true"])):
        LAYOUTS[f"zero{stage}_{precision}"] = (2, [f"--zero_optimization.stage={stage}", *flags])
LAYOUTS.update({
    "tp2": (2, ["--parallelism.tensor_parallel=2"]),
    "tp2_sp": (2, ["--parallelism.tensor_parallel=2", "--parallelism.sequence_parallel=true"]),
    "pp2_1f1b": (2, ["--parallelism.pipeline_parallel=2", "--gradient_accumulation_steps=4"]),
    "pp2_gpipe": (2, ["--parallelism.pipeline_parallel=2", "--parallelism.pipeline_schedule=gpipe",
                      "--gradient_accumulation_steps=4"]),
    "dp2_tp2_pp2": (8, ["--parallelism.tensor_parallel=2", "--parallelism.pipeline_parallel=2",
                        "--gradient_accumulation_steps=4"]),
    "single": (1, []),
    "single_recompute_full": (1, ["--activation_checkpointing.mode=full"]),
})
# ZeRO's placements: stage 3 with every unit sharded (the tiny model's units are below the default
# persistence threshold), host and NVMe optimizer states, NVMe parameters, hybrid sharding, and the
# GPU's host-apart layout run on the CPU (SHARDLM_TEST_OFFLOAD_APART). "{out}" is the run's folder.
SMALL_BUCKETS = ["--zero_optimization.reduce_bucket_size=100000", "--zero_optimization.allgather_bucket_size=100000"]
SHARDED = ["--zero_optimization.stage=3", "--zero_optimization.stage3_param_persistence_threshold=0"]
NVME_STATES = ["--zero_optimization.offload_optimizer.device=nvme",
               "--zero_optimization.offload_optimizer.nvme_path={out}/nvme"]
NVME_PARAMS = ["--zero_optimization.offload_param.device=nvme",
               "--zero_optimization.offload_param.nvme_path={out}/nvme",
               "--zero_optimization.offload_param.max_in_cpu=0"]
CPU_STATES = ["--zero_optimization.offload_optimizer.device=cpu"]
LAYOUTS.update({
    "zero3_sharded_fp32": (2, SHARDED),
    "zero3_sharded_bf16": (2, [*SHARDED, "--bf16.enabled=true"]),
    "zero3_sharded_fp16": (2, [*SHARDED, "--fp16.enabled=true"]),
    "zero1_cpu_states_bf16": (2, ["--zero_optimization.stage=1", *CPU_STATES, "--bf16.enabled=true"]),
    "zero2_cpu_states_fp32": (2, ["--zero_optimization.stage=2", *CPU_STATES]),
    "zero1_nvme_states_fp16": (2, ["--zero_optimization.stage=1", *NVME_STATES, "--fp16.enabled=true"]),
    "zero2_nvme_states_bf16": (2, ["--zero_optimization.stage=2", *NVME_STATES, "--bf16.enabled=true"]),
    "zero3_nvme_params_fp32": (2, [*SHARDED, *NVME_PARAMS]),
    "zero3_nvme_params_states_bf16": (2, [*SHARDED, *NVME_PARAMS, *NVME_STATES, "--bf16.enabled=true"]),
    "zero3_cpu_params_states_apart_bf16": (2, [*SHARDED, "--zero_optimization.offload_param.device=cpu", *CPU_STATES,
                                               "--bf16.enabled=true", "env:SHARDLM_TEST_OFFLOAD_APART=1"]),
    "zero2_nvme_states_apart_fp16": (2, ["--zero_optimization.stage=2", *NVME_STATES, "--fp16.enabled=true",
                                         "env:SHARDLM_TEST_OFFLOAD_APART=1"]),
    "zero3_nvme_params_apart_fp32": (2, [*SHARDED, *NVME_PARAMS, "env:SHARDLM_TEST_OFFLOAD_APART=1"]),
    "zero1_small_buckets_fp16": (2, ["--zero_optimization.stage=1", *SMALL_BUCKETS, "--fp16.enabled=true"]),
    "zero3_sharded_small_buckets_no_overlap_bf16": (2, [*SHARDED, *SMALL_BUCKETS,
                                                    "--zero_optimization.overlap_comm=false", "--bf16.enabled=true"]),
    "zero2_no_overlap_fp32": (2, ["--zero_optimization.stage=2", "--zero_optimization.overlap_comm=false"]),
    "hybrid_zero1_small_buckets_fp16": (4, ["--zero_optimization.stage=1", *SMALL_BUCKETS,
                                            "--parallelism.hybrid_shard=true", "--parallelism.shard_group_size=2",
                                            "--fp16.enabled=true"]),
    "hybrid_zero2_fp32": (4, ["--zero_optimization.stage=2", "--parallelism.hybrid_shard=true",
                              "--parallelism.shard_group_size=2"]),
    "hybrid_zero3_bf16": (4, [*SHARDED, "--parallelism.hybrid_shard=true", "--parallelism.shard_group_size=2",
                              "--bf16.enabled=true"]),
})


def fingerprint(out_dir):
    return [{"step": r["step"], "loss": float(r["loss"]).hex(), "grad_norm": float(r["grad_norm"]).hex(),
             "val_loss": None if r.get("val_loss") is None else float(r["val_loss"]).hex()}
            for r in read_metrics(out_dir / "metrics.jsonl")]


def run_all(shardlm, work, only=None):
    env = clean_env(1)
    result = {}
    for name, (nproc, flags) in LAYOUTS.items():
        if only and not re.search(only, name):
            continue
        out = fresh_dir(work / name)
        extra = dict(f[4:].split("=", 1) for f in flags if f.startswith("env:"))
        flags = [f.replace("{out}", str(out)) for f in flags if not f.startswith("env:")]
        (out / "nvme").mkdir()
        run_checked([shardlm, "train", *BASE, f"--nproc={nproc}", f"--out_dir={out}", "--resume=false", *flags],
                    {**env, **extra}, name)
        result[name] = fingerprint(out)
        print(f"{name}: {len(result[name])} steps, last loss {float.fromhex(result[name][-1]['loss']):.6f}")
    if only and not re.search(only, "zero2_fp32_resumed"):
        return result
    # Resume: 3 steps, then 3 more from the checkpoint, against the 6 uninterrupted steps of zero2_fp32.
    out = fresh_dir(work / "resume")
    flags = ["--zero_optimization.stage=2", "--checkpoint_interval=3"]
    run_checked([shardlm, "train", *BASE, "--nproc=2", f"--out_dir={out}", "--resume=false", *flags, "--steps=3"],
                env, "resume, first half")
    run_checked([shardlm, "train", *BASE, "--nproc=2", f"--out_dir={out}", "--resume=true", *flags], env,
                "resume, second half")
    result["zero2_fp32_resumed"] = fingerprint(out)
    return result


def compare(a_path, b_path):
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    bad = 0
    for name in sorted(set(a) | set(b)):
        same = a.get(name) == b.get(name)
        bad += not same
        print(f"{name:24s} {'bit-identical' if same else 'DIFFERS'} ({len(a.get(name) or [])} steps)")
    print(f"{len(set(a) | set(b)) - bad} of {len(set(a) | set(b))} runs bit-identical")
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="where to write the trajectories (JSON)")
    p.add_argument("--shardlm", default=str(SHARDLM), help="the binary to run (default build/shardlm)")
    p.add_argument("--work", default="/tmp/shardlm_trajectories", help="scratch folder for the runs")
    p.add_argument("--only", help="run only the layouts whose name this regular expression finds (e.g. zero1)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two trajectory files")
    args = p.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.out:
        p.error("--out or --compare is required")
    result = run_all(args.shardlm, Path(args.work), args.only)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({len(result)} runs)")


if __name__ == "__main__":
    _ = REPO
    main()
