"""Peak memory of `shardlm export` from a sharded checkpoint (streamed tensor by tensor) against
the export of the same model from its whole model.safetensors (loaded at once), on a model large
enough that the difference shows (docs/checkpoints.md).

Trains one step of a ~220M-parameter Llama (hidden 1024, 12 layers, 32000-entry vocabulary; ~0.9 GB
of fp32 weights) with ZeRO-3 on 2 ranks, checkpointing at the end, then runs both exports under
/usr/bin/time and prints each one's peak resident set (the kernel's maxrss) and its ratio to the
model's size. Also checks that the two exports wrote the same tensors bit for bit.
Measured 2026-12-01 (2-core AVX-512 EPYC VM): 879 MB model; whole-file export 2121 MB peak (2.41x),
streamed 662 MB (0.75x; 178 MB above the 485 MB of the bare process with libtorch loaded).

  /opt/shardlm/venv/bin/python bench/export_memory.py [--shardlm build/shardlm] [--keep DIR]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MODEL = ["--model.preset=demo", "--model.vocab_size=32000", "--model.hidden_size=1024",
         "--model.intermediate_size=2816", "--model.num_hidden_layers=12", "--model.num_attention_heads=16",
         "--model.num_key_value_heads=16"]


def peak_rss(cmd):
    """Runs cmd under /usr/bin/time -v; returns (peak RSS bytes, output)."""
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    return kb * 1024, p.stdout + p.stderr


def same_tensors(a_path, b_path):
    """Whether two safetensors files hold the same names, dtypes, shapes and bytes (their headers
    may list the tensors in another order)."""
    from safetensors.numpy import load_file
    a, b = load_file(a_path), load_file(b_path)
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--keep", help="work in this directory and keep it")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="export_memory.")
    os.makedirs(work, exist_ok=True)
    run = os.path.join(work, "run")
    train = [a.shardlm, "train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2",
             "--steps=1", "--resume=false", f"--out_dir={run}", "--data.val=", "--threads=1",
             "--zero_optimization.stage=3", "--train_micro_batch_size_per_gpu=1", *MODEL]
    subprocess.run(train, env=ENV, check=True, capture_output=True)
    model_bytes = os.path.getsize(os.path.join(run, "model.safetensors"))
    ckpt = os.path.join(run, "checkpoints")
    shard_bytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckpt) for f in fs)
    whole_peak, _ = peak_rss([a.shardlm, "export", "--run", run, "--out", os.path.join(work, "whole"),
                              "--source", "model"])
    stream_peak, out = peak_rss([a.shardlm, "export", "--run", run, "--out", os.path.join(work, "streamed"),
                                 "--source", "checkpoint"])
    version_peak, _ = peak_rss([a.shardlm, "--version"])
    same = same_tensors(os.path.join(work, "whole", "model.safetensors"),
                        os.path.join(work, "streamed", "model.safetensors"))
    mb = 1e6
    print(f"model: {model_bytes / mb:.0f} MB of fp32 weights; checkpoint: {shard_bytes / mb:.0f} MB in 2 shards (ZeRO-3)")
    print(f"shardlm --version alone (libtorch loaded): peak RSS {version_peak / mb:.0f} MB")
    print(f"export --source model      (whole file loaded): peak RSS {whole_peak / mb:.0f} MB "
          f"= {whole_peak / model_bytes:.2f}x the model")
    print(f"export --source checkpoint (streamed):          peak RSS {stream_peak / mb:.0f} MB "
          f"= {stream_peak / model_bytes:.2f}x the model")
    print(f"streamed / whole: {stream_peak / whole_peak:.2f}; above the bare process: "
          f"{(stream_peak - version_peak) / mb:.0f} MB streamed, {(whole_peak - version_peak) / mb:.0f} MB whole")
    print(f"the two exports hold the same tensors, bit for bit: {same}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
