#!/usr/bin/env python3
"""Training throughput of shardlm's data parallelism against PyTorch DDP, side by side.

Run with the virtual environment's python (/opt/shardlm/venv, made by scripts/setup.sh; it has
torch), from anywhere:

    /opt/shardlm/venv/bin/python bench/ddp_vs_torch.py            # full run, several minutes
    /opt/shardlm/venv/bin/python bench/ddp_vs_torch.py --quick    # smoke run, under a minute

What is measured
----------------
Six configurations train the same Llama shape (default: shardlm's "demo" preset, ~12.6M
parameters, float32) on the same token file with the same per-rank micro-batch and sequence
length, for --steps optimizer steps each:

  shardlm 2 ranks x 1 thread   `shardlm train --nproc 2` (MPI data parallelism, 1 libtorch thread
                               per rank on a 2-core machine)
  shardlm 1 rank  x 1 thread   `--nproc 1 --threads=1`: the per-core baseline for scaling
  shardlm 1 rank  x 2 threads  `--nproc 1 --threads=2`: the same two cores used by intra-op threads
  torch DDP (as it comes)      PyTorch DistributedDataParallel, gloo, 2 processes x 1 thread,
                               glibc's default allocator policy
  torch DDP (+malloc env)      the same, with glibc told to keep freed memory
                               (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1GiB MALLOC_TOP_PAD_=256MiB),
                               which is what shardlm does with mallopt() at start-up
                               (see /work/shared/design/STACK_NOTES.md: page faults are expensive)
  shardlm 2 x 1, BLAS unpinned the first row without OPENBLAS_NUM_THREADS: how the CLI runs today

Threads. libtorch here calls Debian's OpenBLAS (pthreads build) for matrix products, and OpenBLAS
keeps its own thread pool - one thread per core unless OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS)
says otherwise. torch.set_num_threads / at::set_num_threads (shardlm's --threads) size only the
OpenMP pool, not OpenBLAS's. So "1 thread" would still run every GEMM on both cores, and 2 ranks
would run 4 busy threads on 2 cores. Every row except the last therefore sets
OPENBLAS_NUM_THREADS to its threads per rank, so "R ranks x T threads" really uses R*T cores;
the last row shows what leaving it unset costs. (That describes Debian's libtorch 1.13, on which this
benchmark was written. The PyPI torch wheel shardlm now builds on does its matrix products in MKL
inside libtorch's OpenMP pool, which --threads / torch.set_num_threads size, so OPENBLAS_NUM_THREADS
no longer changes anything and the last row should match the first.)

Per step, each run records wall time on rank 0 and tokens/s = global tokens per step / step time.
shardlm writes these to OUT_DIR/metrics.jsonl itself (its step time spans forward, backward with
bucketed all-reduce, loss all-reduce, grad-norm, clipping, AdamW step and zero_grad). The PyTorch
peer measures the same span: from before the batch is assembled and the forward starts to after
optimizer.step() and zero_grad(). The DDP backward's all-reduce and the loss all-reduce keep the
ranks in lock step, so rank 0's step time is the step time of the job.

The first --warmup steps of every run are dropped (allocator growth, first-touch page faults,
oneDNN/gloo set-up). Steps that ran an evaluation are dropped too (evaluation is disabled with
--data.val= anyway). The remaining steps of all repeats are pooled: the table shows their median
tokens/s and the min-max over single steps, plus the median of each repeat so run-to-run drift is
visible. The machine is small and shared, so the configurations are interleaved: each repeat runs
all six, in an order rotated by one per repeat, and only ratios measured in the same invocation
are meaningful - never compare these numbers with absolute thresholds.

The PyTorch peer
----------------
The model is tests/reference/hf_llama.py (a plain-torch transcription of Hugging Face's
LlamaForCausalLM, eager attention) wrapped in an nn.Module; parameters are initialised like
shardlm's (normal(0, initializer_range) for matrices, ones for norms, drawn in HF parameter order
from a CPU generator seeded with the config's seed - which happens to reproduce shardlm's values,
so the step-1 losses agree exactly; speed does not depend on it). The shape, optimizer hyper-parameters, clipping and seed are read from the
train_config.json that shardlm itself resolves (a 1-step probe run at the start), so the two sides
cannot drift apart. AdamW (torch.optim.AdamW, defaults otherwise) decays only parameters with
>= 2 dims, like shardlm. The learning rate is constant (shardlm warms up; this does not change the
work per step). Data: rank r at micro-step m reads the window starting at token (m*N + r)*B*T of the
llm.c token file (inputs B*T tokens, targets shifted by one), as shardlm's DataLoader does.

The step-1 losses of shardlm and the peer are printed as a sanity check: with a 0.02-std random
init both should be close to ln(vocab_size) (8.32 for the 4096-token demo vocabulary).
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# noqa: E402 below: importing common also puts tests/reference (hf_llama) on sys.path.
from common import (REPO, SHARDLM, Config, add_model_args, add_run_length_args, clean_env,  # noqa: E402
                    fresh_dir, llmc_batches, make_peer_optimizer, parse_run_length_args, read_metrics,
                    require_modules, run_checked, run_peer, shardlm_overrides, spawn_ranks)

FULL_DEFAULTS = dict(steps=30, warmup=5, repeats=2, micro_batch=8, seq_len=128, model_set=[])
QUICK_DEFAULTS = dict(steps=4, warmup=1, repeats=1, micro_batch=4, seq_len=64, model_set=[])


# --------------------------------------------------------------------------- #
# Running one configuration
# --------------------------------------------------------------------------- #
def run_shardlm(args, nproc, threads, out_dir, steps, pin_blas=True):
    out_dir = fresh_dir(out_dir)
    cmd = [str(SHARDLM), "train", "--config", str(args.config), "--nproc", str(nproc),
           f"--steps={steps}", f"--out_dir={out_dir}", f"--threads={threads}",
           f"--log_interval={max(steps, 1)}", *shardlm_overrides(args)]
    run_checked(cmd, clean_env(threads if pin_blas else None), f"shardlm ({nproc} rank(s) x {threads} thread(s))")
    return read_metrics(Path(out_dir) / "metrics.jsonl")


# --------------------------------------------------------------------------- #
# The PyTorch DDP peer (runs in its own process, started by common.run_peer)
# --------------------------------------------------------------------------- #
def peer_main(spec_path):
    spawn_ranks(peer_rank, spec_path)


def peer_rank(rank, spec, port):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hf_llama

    torch.set_num_threads(spec["threads"])
    torch.set_num_interop_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    N = spec["nproc"]
    dist.init_process_group("gloo", rank=rank, world_size=N)

    tc = spec["train_config"]
    B, T = spec["micro_batch"], spec["seq_len"]
    model_fields = {k: v for k, v in tc["model"].items()
                    if k not in ("initializer_range", "bos_token_id", "eos_token_id")}
    cfg = hf_llama.LlamaConfig.from_dict(model_fields)

    class HFLlama(torch.nn.Module):
        """hf_llama's functional model over a ParameterList in HF's parameter order."""

        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(tc["seed"])
            shapes = hf_llama.param_shapes(cfg)
            self.names = list(shapes)
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.empty(shape).normal_(0.0, tc["model"]["initializer_range"], generator=gen)
                                   if len(shape) >= 2 else torch.ones(shape))
                for shape in shapes.values())

        def forward(self, input_ids):
            return hf_llama.forward(dict(zip(self.names, self.weights)), cfg, input_ids)

    model = DDP(HFLlama())  # bucket_cap_mb=25 by default; parameters broadcast from rank 0
    params = list(model.parameters())
    optimizer = make_peer_optimizer(spec, params)
    clip = tc["gradient_clipping"]

    batch = llmc_batches(REPO / tc["data"]["train"], rank, N, B, T)  # relative paths: to the repo

    out = open(spec["metrics"], "w") if rank == 0 else None
    for step in range(spec["steps"]):
        t0 = time.perf_counter()
        inputs, targets = batch(step)
        loss = hf_llama.loss_fn(model(inputs), targets)
        loss.backward()  # DDP all-reduces gradient buckets during backward
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum)  # global mean loss, as shardlm logs it
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad()
        global_loss = loss_sum.item() / N
        dt = time.perf_counter() - t0
        if out:
            out.write(json.dumps({"step": step + 1, "loss": global_loss, "grad_norm": float(grad_norm),
                                  "step_time_s": dt, "tokens_per_s": N * B * T / dt}) + "\n")
            out.flush()
    if out:
        out.close()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- #
# Statistics and the table
# --------------------------------------------------------------------------- #
def print_table(configs, args, vocab_size):
    s = {c.key: c.stats(args.warmup) for c in configs}
    torch_plain, torch_malloc = s["torch"]["median"], s["torch_malloc"]["median"]
    print()
    print(f"model {args.model_preset}{' ' + ' '.join(args.model_set) if args.model_set else ''} | "
          f"micro-batch {args.micro_batch} x seq {args.seq_len} per rank | {args.steps} steps, "
          f"first {args.warmup} dropped | {args.repeats} repeat(s), interleaved")
    head = (f"{'config':<30} {'tok/s median':>12} {'min-max (per step)':>19} {'step s':>7} "
            f"{'repeat medians':>16} {'vs DDP':>7} {'vs DDP+malloc':>13}")
    print(head)
    print("-" * len(head))
    for c in configs:
        st = s[c.key]
        reps = ", ".join(f"{m:.0f}" for m in st["repeat_medians"])
        print(f"{c.label:<30} {st['median']:>12.0f} {st['min']:>9.0f}-{st['max']:<9.0f} {st['step_s']:>7.3f} "
              f"{reps:>16} {st['median'] / torch_plain:>6.2f}x {st['median'] / torch_malloc:>12.2f}x")
    print("-" * len(head))
    two, one1, one2 = s["shardlm_2r"]["median"], s["shardlm_1r1t"]["median"], s["shardlm_1r2t"]["median"]
    print(f"scaling, shardlm 2 ranks vs 1 rank x 1 thread : {two / one1:.2f}x  (ideal 2.00x: twice the cores)")
    print(f"scaling, shardlm 2 ranks vs 1 rank x 2 threads: {two / one2:.2f}x  (same two cores, threads vs ranks)")
    print(f"PyTorch DDP, +malloc env vs as it comes       : {torch_malloc / torch_plain:.2f}x")
    print(f"shardlm 2 ranks, OpenBLAS pinned vs unpinned  : {two / s['shardlm_2r_blas']['median']:.2f}x  "
          f"(unpinned: OpenBLAS starts one thread per core in every rank)")

    comm = [r.get("comm_all_reduce_wait_s") for rows in configs[0].measured(args.warmup) for r in rows]
    comm = [x for x in comm if x is not None]
    if comm:
        print(f"shardlm 2 ranks: median all-reduce wait {statistics.median(comm) * 1e3:.0f} ms "
              f"of a {s['shardlm_2r']['step_s'] * 1e3:.0f} ms step (time blocked on communication after backward)")

    ln_v = math.log(vocab_size)
    losses = {c.label.strip(): c.step1_loss() for c in configs if c.key in ("shardlm_2r", "torch", "torch_malloc")}
    ok = all(abs(v - ln_v) < 0.5 for v in losses.values())
    print(f"step-1 loss (global mean over ranks; ln V = {ln_v:.4f}): "
          + ("OK, all within 0.5 of ln V" if ok else "CHECK: a loss is far from ln V"))
    for k, v in losses.items():
        print(f"  {k:<30} {v:.4f}")


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)
    add_model_args(p)
    p.add_argument("--work-dir", type=Path, help="keep every run's metrics here (default: a temporary directory)")
    p.add_argument("--_peer", metavar="SPEC", help=argparse.SUPPRESS)  # internal: run the PyTorch peer
    return parse_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)


def main():
    args = parse_args()
    if args._peer:
        return peer_main(args._peer)
    require_modules("torch")
    if not SHARDLM.exists():
        sys.exit(f"{SHARDLM} not found: build it first (cmake --build build -j2)")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ddp_vs_torch."))
    t_start = time.time()
    load = os.getloadavg()[0]
    print(f"load average before start: {load:.2f}"
          + ("  (other work is running: expect noisy numbers)" if load > 0.5 else ""), file=sys.stderr)

    # Probe: let shardlm resolve the model shape and hyper-parameters once; the peer reuses them.
    probe = work / "probe"
    run_shardlm(args, nproc=1, threads=1, out_dir=probe, steps=1)  # (fresh_dir empties it)
    train_config = json.loads((probe / "train_config.json").read_text())

    configs = [
        Config("shardlm_2r", "shardlm   2 ranks x 1 thread",
               lambda d: run_shardlm(args, 2, 1, d, args.steps)),
        Config("shardlm_1r1t", "shardlm   1 rank  x 1 thread",
               lambda d: run_shardlm(args, 1, 1, d, args.steps)),
        Config("shardlm_1r2t", "shardlm   1 rank  x 2 threads",
               lambda d: run_shardlm(args, 1, 2, d, args.steps)),
        Config("torch", "torch DDP 2 x 1 (as it comes)",
               lambda d: run_peer(args, train_config, 2, False, d)),
        Config("torch_malloc", "torch DDP 2 x 1 (+malloc env)",
               lambda d: run_peer(args, train_config, 2, True, d)),
        Config("shardlm_2r_blas", "shardlm   2 x 1, BLAS unpinned",
               lambda d: run_shardlm(args, 2, 1, d, args.steps, pin_blas=False)),
    ]
    total = len(configs) * args.repeats
    done = 0
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]  # rotate: interleave
        for c in order:
            done += 1
            t0 = time.time()
            c.repeats.append(c.run(work / f"{c.key}.{rep}"))
            med = statistics.median(r["tokens_per_s"] for r in c.repeats[-1] if r["step"] > args.warmup)
            print(f"[{done}/{total}] {c.label.strip():<30} repeat {rep + 1}: median {med:.0f} tok/s "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)

    print_table(configs, args, train_config["model"]["vocab_size"])
    print(f"total wall time {time.time() - t_start:.0f} s; load average before {load:.2f}, now {os.getloadavg()[0]:.2f}")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"per-run metrics.jsonl files are under {work}")


if __name__ == "__main__":
    main()
