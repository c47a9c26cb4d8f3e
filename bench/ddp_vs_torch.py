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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARDLM = REPO / "build" / "shardlm"
sys.path.insert(0, str(REPO / "tests" / "reference"))

# What shardlm sets with mallopt() at start-up (src/cli/cmd_train.cpp), as glibc environment
# variables: no mmap for big blocks, trim only above 1 GiB, grow the heap 256 MiB at a time.
MALLOC_KEEP_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}

FULL_DEFAULTS = dict(steps=30, warmup=5, repeats=2, micro_batch=8, seq_len=128, model_set=[])
QUICK_DEFAULTS = dict(steps=4, warmup=1, repeats=1, micro_batch=4, seq_len=64, model_set=[])


# --------------------------------------------------------------------------- #
# Running one configuration
# --------------------------------------------------------------------------- #
def clean_env(blas_threads, extra=None):
    """The caller's environment without glibc malloc tuning or thread-count variables, plus
    OPENBLAS_NUM_THREADS=blas_threads (None: leave OpenBLAS to its default, one thread per core)
    and `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    env.update(extra or {})
    return env


def run_checked(cmd, env, what, timeout_s=3600):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        sys.exit(f"{what} failed (exit {proc.returncode}):\n  {' '.join(map(str, cmd))}\n{tail}")


def shardlm_overrides(args):
    """--key=value overrides shared by every shardlm run (and the probe)."""
    o = [
        f"--train_micro_batch_size_per_gpu={args.micro_batch}",
        "--gradient_accumulation_steps=1",
        f"--data.seq_len={args.seq_len}",
        "--data.val=",  # no evaluation steps
        f"--model.preset={args.model_preset}",
    ]
    o += [f"--model.{kv}" for kv in args.model_set]
    return o


def fresh_dir(path):
    """An empty run directory (shardlm resumes from a checkpoint it finds in --out_dir)."""
    shutil.rmtree(path, ignore_errors=True)
    Path(path).mkdir(parents=True)
    return Path(path)


def run_shardlm(args, nproc, threads, out_dir, steps, pin_blas=True):
    out_dir = fresh_dir(out_dir)
    cmd = [str(SHARDLM), "train", "--config", str(args.config), "--nproc", str(nproc),
           f"--steps={steps}", f"--out_dir={out_dir}", f"--threads={threads}",
           f"--log_interval={max(steps, 1)}", *shardlm_overrides(args)]
    run_checked(cmd, clean_env(threads if pin_blas else None), f"shardlm ({nproc} rank(s) x {threads} thread(s))")
    return read_metrics(Path(out_dir) / "metrics.jsonl")


def run_peer(args, train_config, nproc, malloc_keep, out_dir, spec_extra=None):
    """Runs this file in --_peer mode in a fresh process, so that the glibc variables take
    effect from the first malloc of the launcher and of every spawned rank. `spec_extra` adds
    keys to the peer's spec (e.g. {"zero_redundancy": True}, see make_peer_optimizer)."""
    out_dir = fresh_dir(out_dir)
    spec = {
        "nproc": nproc,
        "threads": 1,
        "steps": args.steps,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "train_config": train_config,
        "metrics": str(Path(out_dir) / "metrics.jsonl"),
        **(spec_extra or {}),
    }
    spec_path = out_dir / "peer_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = clean_env(spec["threads"], MALLOC_KEEP_ENV if malloc_keep else None)
    run_checked([sys.executable, str(Path(__file__).resolve()), "--_peer", str(spec_path)], env,
                "PyTorch DDP peer" + (f" {spec_extra}" if spec_extra else ""))
    return read_metrics(spec["metrics"])


def read_metrics(path):
    """metrics.jsonl rows (shardlm's format; the peer writes the same keys)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- #
# The PyTorch DDP peer (runs in its own process, see run_peer)
# --------------------------------------------------------------------------- #
def spawn_ranks(rank_fn, spec_path):
    """Runs rank_fn(rank, spec, port) in spec["nproc"] processes, with a free rendezvous port."""
    import torch.multiprocessing as mp

    spec = json.loads(Path(spec_path).read_text())
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_fn, args=(spec, port), nprocs=spec["nproc"], join=True)


def peer_main(spec_path):
    spawn_ranks(peer_rank, spec_path)


def load_llmc_tokens(path):
    """llm.c .bin: 256 int32 header (magic 20240520, version, token count), then uint16 tokens."""
    import numpy as np

    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520:
        raise SystemExit(f"{path}: not an llm.c token file (magic {header[0]})")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=256 * 4, shape=(int(header[2]),))


def llmc_batches(path, rank, nranks, B, T):
    """batch(micro_step) -> (inputs, targets) int64 [B, T] for this rank, in shardlm's DataLoader
    order: the window of B*T+1 tokens at ((m mod E)*N + r)*B*T, E = windows in one pass."""
    import torch

    tokens = load_llmc_tokens(path)
    steps_per_pass = (len(tokens) - 1) // (nranks * B * T)

    def batch(micro_step):
        start = ((micro_step % steps_per_pass) * nranks + rank) * B * T
        window = torch.from_numpy(tokens[start:start + B * T + 1].astype("int64"))
        return window[:-1].view(B, T), window[1:].view(B, T)
    return batch


def make_peer_optimizer(spec, params):
    """torch.optim.AdamW with shardlm's hyper-parameters (decay only on >= 2-dim parameters); with
    spec["zero_redundancy"], the same AdamW wrapped in torch.distributed.optim.ZeroRedundancyOptimizer
    (each rank keeps the AdamW state of its share of the parameters and broadcasts them after its
    step: PyTorch's ZeRO stage 1; bench/zero_stages.py uses this)."""
    import torch

    opt_p = spec["train_config"]["optimizer"]["params"]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": opt_p["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    hyper = dict(lr=opt_p["lr"], betas=tuple(opt_p["betas"]), eps=opt_p["eps"])
    if spec.get("zero_redundancy"):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper)
    return torch.optim.AdamW(groups, **hyper)


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
class Config:
    def __init__(self, key, label, run):
        self.key, self.label, self.run = key, label, run
        self.repeats = []  # list of per-run metric rows (all steps)

    def measured(self, warmup):
        """Per repeat: the rows after warm-up, without evaluation steps."""
        return [[r for r in rows if r["step"] > warmup and "val_loss" not in r] for rows in self.repeats]

    def stats(self, warmup):
        per_repeat = self.measured(warmup)
        pooled = [r["tokens_per_s"] for rows in per_repeat for r in rows]
        return {
            "median": statistics.median(pooled),
            "min": min(pooled),
            "max": max(pooled),
            "step_s": statistics.median(r["step_time_s"] for rows in per_repeat for r in rows),
            "repeat_medians": [statistics.median(r["tokens_per_s"] for r in rows) for rows in per_repeat],
            "n": len(pooled),
        }

    def step1_loss(self):
        return self.repeats[0][0]["loss"]


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
def require_modules(*names, setup="bash scripts/setup.sh"):
    """Exits with a clear message unless every module imports (the benches need the pinned environment)."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            sys.exit(f"{e}: run this benchmark with the virtual environment's python, /opt/shardlm/venv/bin/python "
                     f"({setup} installs it)")


def add_model_args(p, config_help="shardlm config the runs start from (default configs/demo.json)"):
    """--model-preset, --model-set and --config: the model and config every bench script starts from."""
    p.add_argument("--model-preset", default="demo", help="shardlm model preset (default demo)")
    p.add_argument("--model-set", action="append", metavar="FIELD=VALUE",
                   help="override a model field (HF config.json name), e.g. --model-set num_hidden_layers=2; "
                        "repeatable; replaces --quick's shrink where a script has one")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "demo.json", help=config_help)


def add_shardlm_arg(p):
    p.add_argument("--shardlm", type=Path, default=REPO / "build" / "shardlm",
                   help="shardlm binary (default build/shardlm); copied into the work directory first")


def add_run_length_args(p, full, quick, quick_time="< 1 min"):
    """Options every benchmark here shares: run length and batch shape, with --quick's defaults."""
    p.add_argument("--quick", action="store_true", help=f"smoke run, {quick_time}: defaults become {quick}")
    p.add_argument("--steps", type=int, help=f"optimizer steps per run (default {full['steps']})")
    p.add_argument("--warmup", type=int, help=f"steps dropped at the start of each run (default {full['warmup']})")
    p.add_argument("--repeats", type=int, help=f"runs of every timed configuration (default {full['repeats']})")
    p.add_argument("--micro-batch", type=int, help=f"sequences per rank per step (default {full['micro_batch']})")
    p.add_argument("--seq-len", type=int, help=f"tokens per sequence (default {full['seq_len']})")


def parse_run_length_args(p, full, quick):
    """Parses, fills unset run-length options from the full or --quick defaults, checks them."""
    args = p.parse_args()
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} leaves no measured steps out of --steps {args.steps}")
    return args


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
