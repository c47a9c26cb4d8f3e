"""Elastic restarts under fire (issue 27; not part of CI): an 8-rank run of --steps steps under
`--max-restarts`, one random rank SIGKILLed every ~--every steps, must finish with the uninterrupted
run's exact trajectory; a second run whose hostfile drops from 8 slots to 4 at the first kill must
finish on 4 ranks (accumulation doubled) matching the uninterrupted run to fp32 summation order over
the steps right after the restart; no rank process may outlive its job and no /dev/shm/shardlm-*
segment may be left. Prints the counts (kills, restarts, steps lost to them, wall time).

    /opt/shardlm/venv/bin/python bench/elastic_stress.py                # 8 ranks, 500 steps, a kill every ~50
    /opt/shardlm/venv/bin/python bench/elastic_stress.py --steps 120 --every 30 --nproc 4   # quicker

The fp64 proof that a shrink reads the same global samples is tests/mpi/test_checkpoint.cpp's
(CheckpointReshard.ShuffledDp4ToDp2Zero3); the CLI trains in fp32, so this compares in fp32."""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SHARDLM, clean_env, kill_session, read_metrics  # noqa: E402


def rank_pids(out_dir):
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=" in env and str(out_dir).encode() in cmd:
            pids.append(int(name))
    return pids


def steps_done(out_dir):
    try:
        return sum(1 for _ in open(Path(out_dir) / "metrics.jsonl"))
    except OSError:
        return 0


def shm_segments():
    return sorted(p.name for p in Path("/dev/shm").glob("shardlm-*"))


def train_cmd(args, out_dir, launch):
    return [str(SHARDLM), "train", "--config", "configs/tiny.json", *launch, f"--out_dir={out_dir}",
            f"--steps={args.steps}", "--data.val=", "--checkpoint_interval=5", "--log_interval=100000",
            "--resume=false", "--data.shuffle=true", "--zero_optimization.stage=3", "--threads=1",
            f"--train_micro_batch_size_per_gpu={args.micro_batch}"]


def supervised(args, out_dir, launch, rng, on_first_kill=None):
    """Runs the job under --max-restarts, killing a random rank every ~args.every steps."""
    env = clean_env(1)
    t0 = time.time()
    p = subprocess.Popen(train_cmd(args, out_dir, launch) + ["--max-restarts", str(args.max_restarts)], cwd=REPO,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    kills, next_kill = 0, rng.randint(args.every // 2, args.every * 3 // 2)
    while p.poll() is None:
        if steps_done(out_dir) >= next_kill and next_kill < args.steps - 5:
            pids = rank_pids(out_dir)
            if pids:
                if kills == 0 and on_first_kill:
                    on_first_kill()
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
                next_kill += rng.randint(args.every // 2, args.every * 3 // 2)
        time.sleep(0.01)
    out, err = p.communicate()
    leftover = kill_session(p.pid)
    if p.returncode != 0:
        sys.exit(f"supervised run failed (exit {p.returncode}):\n{err[-3000:]}")
    restarts = [json.loads(line) for line in open(Path(out_dir) / "restarts.jsonl")] if kills else []
    return {"kills": kills, "restarts": len(restarts), "wall_s": time.time() - t0, "orphans": leftover, "restart_records": restarts}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--every", type=int, default=50, help="steps between kills, on average")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--max-restarts", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if not SHARDLM.exists():
        sys.exit("build shardlm first: bash scripts/build.sh")
    rng = random.Random(args.seed)
    shm_before = shm_segments()
    with tempfile.TemporaryDirectory(prefix="shardlm_elastic_") as tmp:
        tmp = Path(tmp)
        print(f"load average before: {os.getloadavg()}")
        t0 = time.time()
        straight = tmp / "straight"
        subprocess.run(train_cmd(args, straight, ["--nproc", str(args.nproc)]), cwd=REPO, env=clean_env(1), check=True,
                       capture_output=True)
        straight_s = time.time() - t0
        ref = read_metrics(straight / "metrics.jsonl")

        same = tmp / "same"
        s = supervised(args, same, ["--nproc", str(args.nproc)], rng)
        got = read_metrics(same / "metrics.jsonl")
        same_ok = [(r["loss"], r["grad_norm"]) for r in ref] == [(r["loss"], r["grad_norm"]) for r in got]
        weights_ok = (straight / "model.safetensors").read_bytes() == (same / "model.safetensors").read_bytes()

        shrink = tmp / "shrink"
        shrink.mkdir()
        hostfile = shrink / "hosts"
        hostfile.write_text(f"localhost slots={args.nproc}\n")
        k = supervised(args, shrink, ["--hostfile", str(hostfile)], rng,
                       on_first_kill=lambda: hostfile.write_text(f"localhost slots={args.nproc // 2}\n"))
        got2 = read_metrics(shrink / "metrics.jsonl")
        first = k["restart_records"][0]["resume_step"] if k["restart_records"] else 0
        worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(ref[first:first + 3], got2[first:first + 3]))
        ranks_after = [r["ranks"] for r in k["restart_records"]]

        print(f"uninterrupted: {args.nproc} ranks, {args.steps} steps, {straight_s:.1f} s")
        print(f"same size: {s['kills']} kills, {s['restarts']} restarts, {s['wall_s']:.1f} s; "
              f"trajectory bit-identical: {same_ok}, final weights identical: {weights_ok}; "
              f"steps {len(got)} (expected {args.steps}); processes left: {s['orphans']}")
        print(f"shrink {args.nproc} -> {args.nproc // 2}: {k['kills']} kills, {k['restarts']} restarts, ranks after each: "
              f"{ranks_after}; worst relative loss deviation over the 3 steps after the first restart (step {first}): "
              f"{worst:.2e}; steps {len(got2)}; processes left: {k['orphans']}")
    leaked = [x for x in shm_segments() if x not in shm_before]
    print(f"/dev/shm/shardlm-* segments left behind: {len(leaked)} {leaked}")
    print(f"load average after: {os.getloadavg()}")
    ok = same_ok and weights_ok and len(got) == args.steps and len(got2) == args.steps and not leaked and worst < 1e-5
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
