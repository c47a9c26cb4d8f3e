"""kill -9 of a whole training job while it checkpoints every step, then resume (docs/checkpoints.md).

Each trial starts `shardlm train` (2 ranks, ZeRO-2 by default, checkpoint_interval=1) in a fresh
out_dir, kills every process of its session (mpirun and each rank, bench/common.py's kill_session)
with SIGKILL at a random moment, then resumes to the end. A
trial passes when the resume neither refuses nor misreads: it exits 0, and its losses from the step it
resumed after, and its final weights, equal a straight run's bit for bit (a checkpoint whose weights
held another step than it claims would diverge). Also prints save/load times and checkpoint sizes
against the model's size.

  /opt/shardlm/venv/bin/python bench/kill9_checkpoint.py [--trials 20] [--steps 12] [--seed 1]
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import kill_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDLM = os.path.join(ROOT, "build", "shardlm")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def args_for(out_dir, a):
    return [a.shardlm, "train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2",
            "--data.val=", "--log_interval=1", f"--steps={a.steps}", f"--out_dir={out_dir}",
            f"--zero_optimization.stage={a.stage}", "--checkpoint_interval=1", *a.extra]


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shardlm", default=SHARDLM, help="the binary (a copy lets you rebuild while it runs)")
    p.add_argument("extra", nargs="*", help="more shardlm train arguments, e.g. --bf16.enabled=true")
    a = p.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="shardlm_kill9_")
    straight = os.path.join(work, "straight")
    r = subprocess.run(args_for(straight, a), env=ENV, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("straight run failed:\n" + r.stdout + r.stderr)
    ref, ref_model = metrics(straight), read(os.path.join(straight, "model.safetensors"))
    saves = [float(x) for x in re.findall(r"checkpoint of step \d+ saved in ([\d.]+) s", r.stdout)]
    step_time = statistics.median(r["step_time_s"] for r in ref.values()) + statistics.median(saves)
    ckpt = os.path.join(straight, "checkpoints", f"step-{a.steps:06d}")
    with open(os.path.join(ckpt, "checkpoint.json")) as f:
        meta = json.load(f)
    ckpt_bytes = sum(x["bytes"] for x in meta["files"])
    model_bytes = os.path.getsize(os.path.join(straight, "model.safetensors"))

    passed, loads, resumed_after = 0, [], []
    for trial in range(a.trials):
        d = os.path.join(work, f"trial{trial}")
        proc = subprocess.Popen(args_for(d, a), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        # The moment: once step k (random) is logged, a random part of one step later, so kills land
        # in every phase of the training loop, saves included.
        k, delay = rng.randint(1, a.steps - 1), rng.uniform(0, step_time)
        path = os.path.join(d, "metrics.jsonl")
        while proc.poll() is None:
            if os.path.exists(path) and len(read(path).splitlines()) >= k:
                break
            time.sleep(0.005)
        time.sleep(delay)
        killed = kill_session(proc.pid)  # the session's id is the leader's pid
        proc.wait()
        r = subprocess.run(args_for(d, a), env=ENV, capture_output=True, text=True)
        out = r.stdout + r.stderr
        m = re.search(r"after step (\d+)", out)
        after = int(m.group(1)) if m else 0
        ok = r.returncode == 0
        problems = [] if ok else [f"exit {r.returncode}: {out[-400:]}"]
        if ok:
            got = metrics(d)
            for s in range(after + 1, a.steps + 1):
                if got[s]["loss"] != ref[s]["loss"] or got[s]["grad_norm"] != ref[s]["grad_norm"]:
                    problems.append(f"step {s} differs from the straight run")
                    break
            if read(os.path.join(d, "model.safetensors")) != ref_model:
                problems.append("final weights differ from the straight run")
            lm = re.search(r"verified and loaded in ([\d.]+) s", out)
            if lm:
                loads.append(float(lm.group(1)))
        passed += not problems
        resumed_after.append(after)
        print(f"trial {trial + 1:2d}: killed {killed} process(es), resumed after step {after:2d}: " + ("ok" if not problems else "; ".join(problems)),
              flush=True)
        shutil.rmtree(d, ignore_errors=True)
    print(f"\n{passed}/{a.trials} trials resumed correctly (resumed after steps {sorted(resumed_after)})")
    print(f"model {model_bytes / 1e6:.2f} MB (fp32 HF file); checkpoint {ckpt_bytes / 1e6:.2f} MB in "
          f"{len(meta['files'])} shard(s) = {ckpt_bytes / model_bytes:.2f}x the model; layout {meta['layout']}")
    if saves:
        print(f"save: median {statistics.median(saves):.3f} s, max {max(saves):.3f} s over {len(saves)} saves")
    if loads:
        print(f"verify + load: median {statistics.median(loads):.3f} s, max {max(loads):.3f} s over {len(loads)} resumes")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed == a.trials else 1)


if __name__ == "__main__":
    main()
