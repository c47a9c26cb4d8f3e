#!/usr/bin/env python3
"""shardlm against its peers: PyTorch DDP, PyTorch FSDP2 and DeepSpeed ZeRO-1/2/3, on one problem.

Why: shardlm exists to be a C++ answer to DeepSpeed ZeRO and PyTorch DDP/FSDP. This script trains
the same model from the same weights on the same tokens with the same optimizer in every system,
in one invocation, and prints shardlm's speed and memory as ratios against the peer of each ZeRO
stage - and fails when the systems do not compute the same step-1 loss (then they are not training
the same problem, and no ratio means anything).

Run with the virtual environment's python (it has torch, transformers and - after
`bash scripts/setup.sh --peers` - DeepSpeed), from anywhere:

    /opt/shardlm/venv/bin/python bench/peers.py --quick                 # ~2.5 min on 2 cores
    /opt/shardlm/venv/bin/python bench/peers.py --json peers.json       # full run, ~20 min (estimate)
    /opt/shardlm/venv/bin/python bench/peers.py --quick --only shardlm,torch-ddp   # a subset

What runs (2 ranks x 1 thread each, float32, gradient accumulation 1, no evaluation)
------------------------------------------------------------------------------------
  shardlm      stages 0, 1, 2, 3   `shardlm train --init=DIR --zero_optimization.stage=S`, each rank
                                   under mpirun wrapped in /usr/bin/time (peak RSS)
  torch-ddp    stage 0             DistributedDataParallel (gloo), bucket_cap_mb 25
  torch-fsdp2  stage 3             torch.distributed.fsdp.fully_shard (gloo, CPU device mesh) on the
                                   embedding, each decoder layer and the root (final norm + head):
                                   shardlm's ZeRO units; reshard after forward (full shard)
  deepspeed    stages 1, 2, 3      deepspeed.initialize on DeepSpeed's CPU accelerator
                                   (DS_ACCELERATOR=cpu, gloo), zero_optimization taken from the
                                   zero_optimization section shardlm resolved (DeepSpeed's names)

The same problem
----------------
- Model and initial weights: a 1-step shardlm probe with lr 0 writes config.json + model.safetensors
  of shardlm's own initialisation (AdamW with lr 0 leaves every weight as it was). shardlm starts
  the timed runs from that directory with `init`; the peers build transformers' LlamaForCausalLM
  (eager attention) from the same config.json and load the same file with strict=True.
- Data: the llm.c token file of the config (data/brown/train.bin); rank r of N at micro-step m
  reads B*T+1 tokens at (m*N + r)*B*T (inputs the first B*T, targets shifted by one), as shardlm's
  DataLoader does (bench/common.py's llmc_batches). The peers
  compute the loss as mean cross-entropy of logits against those targets (not HF's labels=, which
  would shift again).
- Optimizer: torch.optim.AdamW with the config's lr, betas, eps, weight decay on >= 2-D tensors
  only (bench/common.py's make_peer_optimizer), constant LR in every system
  (`--scheduler={"type":"constant"}` for shardlm), global-norm clipping to gradient_clipping
  (clip_grad_norm_ for DDP/FSDP2, DeepSpeed's own gradient_clipping for ZeRO). DeepSpeed takes
  the torch AdamW as a client optimizer (zero_allow_untested_optimizer): its own FusedAdam needs a
  compiled op.
- Threads: torch.set_num_threads(1) / `--threads=1`, OMP_NUM_THREADS=MKL_NUM_THREADS=1 for all.

Measured per system and stage: median tokens/s and step time over the steps after --warmup (rank 0's
wall time of forward + backward + communication + clipping + AdamW step), the step-1 loss (mean
over all ranks' tokens), and the peak resident set per rank (max over ranks and repeats):
getrusage(RUSAGE_SELF).ru_maxrss in each peer rank, /usr/bin/time's %M (the same kernel counter)
for each shardlm rank. The peers' peak includes the Python interpreter, torch/transformers/DeepSpeed
imports and the full model built on every rank before it is sharded; shardlm's includes libtorch
and the init file read on every rank. shardlm resets its high-water mark once, at its first
micro-step (to measure activations, src/util/process_memory.h); it keeps freed heap memory
(mallopt), so only transient file mappings before that point are missed.

Step-1 loss check: every system evaluates the same fp32 function on the same weights and tokens;
only the order of floating-point operations differs (GEMM blocking, reduction trees, softmax).
Each fp32 rounding is ~6e-8 relative; summed over the few layers and the 4096-way log-softmax
the expected spread is ~1e-7..1e-6 relative (measured: 6e-8). --loss-rtol (default 1e-5) leaves an
order of magnitude of margin, yet catches (measured on the quick model) a token window shifted by
one token or one row (6e-4), a re-drawn embedding or head (2e-3, 5e-4), rms_norm_eps 1e-6 instead
of 1e-5 (3e-5). From a 0.02-std init not every difference shows at step 1 (rope_theta 5e5 instead
of 1e4: 3e-6), so the last-step loss spread, which also compares the optimizers, is printed too.
The script exits non-zero when any two systems' step-1 losses differ by more than the bound, or
when a run failed (its row carries the error).

Systems are interleaved: every repeat runs all of them once, in an order rotated by one per
repeat. The machine is small and shared; only ratios measured in the same invocation mean
anything.
"""

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (REPO, MALLOC_KEEP_ENV, add_model_args, add_run_length_args, add_shardlm_arg,  # noqa: E402
                    clean_env, fresh_dir, require_modules, spawn_ranks,
                    llmc_batches, make_peer_optimizer, parse_run_length_args, read_metrics,
                    run_checked, shardlm_overrides)

NPROC = 2
FULL_DEFAULTS = dict(steps=20, warmup=5, repeats=2, micro_batch=8, seq_len=128, model_set=[])
# Quick: zero_stages.py's 2-layer, 192-wide demo variant (same vocabulary), few short steps:
# 9 runs, each paying MPI / torch / DeepSpeed start-up.
QUICK_DEFAULTS = dict(steps=6, warmup=2, repeats=1, micro_batch=4, seq_len=64,
                      model_set=["num_hidden_layers=2", "hidden_size=192", "intermediate_size=512"])
# --shape: the sizes issue 26 measures at, where the products dominate the step (the demo's vocabulary
# of 4096). "realistic": 27.4M parameters; "larger": 56.6M. Each sets micro-batch, sequence and model
# unless given on the command line.
SHAPES = {
    "realistic": dict(micro_batch=4, seq_len=512, model_set=[
        "hidden_size=512", "num_hidden_layers=8", "num_attention_heads=8", "num_key_value_heads=4",
        "intermediate_size=1376"]),
    "larger": dict(micro_batch=4, seq_len=512, model_set=[
        "hidden_size=768", "num_hidden_layers=8", "num_attention_heads=12", "num_key_value_heads=4",
        "intermediate_size=2048"]),
}
# The bars, checked on every full run and written to the JSON (a run is not a test: the
# machine is shared, so a missed bar is reported, not an error).
BARS = {"stage_vs_stage0": 0.97, "stage0_vs_machine_limit": 0.9, "stage0_vs_torch-ddp": 1.0,
        "vs_deepspeed": 1.15, "vs_torch-fsdp2": 1.3, "peak_rss_vs_peer": 1.0}
SYSTEMS = ("shardlm", "torch-ddp", "torch-fsdp2", "deepspeed")
MB = 1e6
PEER_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    "DS_ACCELERATOR": "cpu",        # DeepSpeed's CPU accelerator (gloo without oneCCL bindings)
    "CUDA_VISIBLE_DEVICES": "",     # the torch wheel is a CUDA build; keep every system off CUDA
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# --------------------------------------------------------------------------- #
# Runs (in this process)
# --------------------------------------------------------------------------- #
class Run:
    """One system at one ZeRO stage; `results` holds one dict per repeat:
    {"rows": metrics rows (rank 0), "rss": [peak bytes per rank]}."""

    def __init__(self, system, stage, launch):
        self.system, self.stage, self.launch = system, stage, launch
        self.results, self.error = [], None

    @property
    def label(self):
        return f"{self.system} stage {self.stage}"

    def row(self, warmup):
        """The --json row: medians over measured steps of all repeats pooled."""
        row = {"system": self.system, "stage": self.stage, "tokens_per_s": None, "step_time_s": None,
               "step1_loss": None, "peak_rss_bytes": None}
        if self.error:
            row["error"] = self.error
            return row
        measured = [r for res in self.results for r in res["rows"] if r["step"] > warmup]
        row.update(tokens_per_s=statistics.median(r["tokens_per_s"] for r in measured),
                   step_time_s=statistics.median(r["step_time_s"] for r in measured),
                   tokens_per_s_min=min(r["tokens_per_s"] for r in measured),
                   tokens_per_s_max=max(r["tokens_per_s"] for r in measured),
                   repeat_medians=self.repeat_medians(warmup),
                   step1_loss=self.results[0]["rows"][0]["loss"],
                   peak_rss_bytes=max(max(res["rss"]) for res in self.results),
                   last_loss=self.results[0]["rows"][-1]["loss"])
        return row

    def repeat_medians(self, warmup):
        """tokens/s per repeat (the median of its measured steps), in repeat order."""
        return [statistics.median(r["tokens_per_s"] for r in res["rows"] if r["step"] > warmup)
                for res in self.results]


def error_text(exc):
    """A one-paragraph error for a row: run_checked's message, the last exception line first."""
    text = str(exc.code if isinstance(exc, SystemExit) else exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "failed"
    key = [ln for ln in lines if "Error" in ln or "Exception" in ln or "error:" in ln]
    main = key[-1] if key else lines[-1]
    return main if main == lines[0] else f"{main}  [{lines[0][:200]}]"


def run_shardlm(args, stage, out_dir):
    """`shardlm train` on NPROC ranks started by mpirun here (rather than --nproc), so that each
    rank runs under /usr/bin/time, which writes its peak RSS (KiB) to out_dir/maxrss_kb.<rank>."""
    out_dir = fresh_dir(out_dir)
    train = [str(args.binary), "train", "--config", str(args.config), f"--init={args.init_dir}",
             f"--steps={args.steps}", f"--out_dir={out_dir}", "--threads=1", "--resume=false",
             f"--log_interval={args.steps}", f"--train_micro_batch_size_per_gpu={args.micro_batch}",
             "--gradient_accumulation_steps=1", f"--data.seq_len={args.seq_len}", "--data.val=",
             '--scheduler={"type":"constant"}', f"--optimizer.params.lr={args.lr}",
             f"--zero_optimization.stage={stage}"]
    wrap = ["sh", "-c", 'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"', str(out_dir / "maxrss_kb")]
    cmd = ["mpirun", "-n", str(NPROC), "--bind-to", "none",
           *(["--oversubscribe"] if (os.cpu_count() or 1) < NPROC else []), *wrap, *train]
    run_checked(cmd, clean_env(1, PEER_ENV), f"shardlm stage {stage}", timeout_s=args.timeout)
    rss = [int((out_dir / f"maxrss_kb.{r}").read_text().split()[-1]) * 1024 for r in range(NPROC)]
    return {"rows": read_metrics(out_dir / "metrics.jsonl"), "rss": rss}


def run_peer(args, system, stage, out_dir):
    """This file in --_peer mode, in a fresh process (so the environment holds from its start),
    which spawns NPROC ranks; rank 0 writes out_dir/result.json."""
    out_dir = fresh_dir(out_dir)
    spec = {"system": system, "stage": stage, "nproc": NPROC, "steps": args.steps,
            "micro_batch": args.micro_batch, "seq_len": args.seq_len, "init_dir": str(args.init_dir),
            "train_config": args.train_config, "result": str(out_dir / "result.json")}
    (out_dir / "spec.json").write_text(json.dumps(spec))
    env = clean_env(1, {**PEER_ENV, **(MALLOC_KEEP_ENV if args.peer_malloc_keep else {})})
    run_checked([sys.executable, str(Path(__file__).resolve()), "--_peer", str(out_dir / "spec.json")],
                env, f"{system} stage {stage}", timeout_s=args.timeout)
    return json.loads((out_dir / "result.json").read_text())


def make_init(args, work):
    """1-step shardlm probe with lr 0: its output directory holds config.json and model.safetensors
    of shardlm's initial weights (AdamW with lr 0 changes nothing), and its train_config.json the
    resolved hyper-parameters. Returns the directory."""
    probe = fresh_dir(work / "init")
    cmd = [str(args.binary), "train", "--config", str(args.config), "--nproc", "1", "--steps=1",
           f"--out_dir={probe}", "--threads=1", "--resume=false", "--log_interval=1",
           "--optimizer.params.lr=0", '--scheduler={"type":"constant"}', *shardlm_overrides(args)]
    run_checked(cmd, clean_env(1, PEER_ENV), "shardlm probe (initial weights)", timeout_s=args.timeout)
    return probe


def measure_machine(args, tag):
    """The machine's compute limit for this model, measured on the same 2 ranks x 1 thread as the runs:
    `shardlm bench machine --model` times the model's own products (each GEMM shape of forward and
    backward) and its attention at this micro-batch and sequence; `shardlm plan --machine` adds them
    up over one step (the time model's forward_s + backward_s at zero stage 0: compute alone, no
    communication, optimizer or data). model FLOPs / that time is the rate a perfect trainer would
    reach on these kernels; the peak is the fastest single product shape."""
    out = args.work / f"machine.{tag}.json"
    env = clean_env(1, PEER_ENV)
    run_checked([str(args.binary), "bench", "machine", "--nproc", str(NPROC), "--threads", "1",
                 "--model", str(args.init_dir / "config.json"), "--micro-batch", str(args.micro_batch),
                 "--seq-len", str(args.seq_len), "--no-grid", "--dtypes", "fp32", "--disk", "none",
                 "--max-bytes", "4MiB", "--out", str(out)], env, f"shardlm bench machine ({tag})",
                timeout_s=args.timeout)
    plan = subprocess.run([str(args.binary), "plan", "--model", str(args.init_dir / "config.json"),
                           "--devices", str(NPROC), "--micro-batch", str(args.micro_batch), "--seq-len",
                           str(args.seq_len), "--precision", "fp32", "--zero-stage", "0", "--machine", str(out),
                           "--json"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    st = json.loads(plan.stdout)["predicted"]["stages"][0]
    profile = json.loads(out.read_text())
    compute_s = st["forward_s"] + st["backward_s"]
    return {"when": tag, "description": profile["description"],
            "model_flops_per_rank_step": st["model_flops"], "compute_s": compute_s,
            "limit_flops_per_s": st["model_flops"] / compute_s,
            "gemm_peak_flops_per_s": max(g["flops_per_s"] for g in profile["gemm"] if g["dtype"] == "fp32"),
            "attention_flops_per_s": {"forward": profile["attention_forward"]["fp32"],
                                      "backward": profile["attention_backward"]["fp32"]},
            "predicted_step_s_stage0": st["step_s"]}


def paired_ratios(a, b, warmup):
    """a over b per repeat (both ran in every repeat, next to each other): the median and the range."""
    xs = [x / y for x, y in zip(a.repeat_medians(warmup), b.repeat_medians(warmup))]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "per_repeat": xs}


def evaluate_bars(runs, machine, args):
    """Issue 26's bars from this invocation's numbers: {name: {median, min, max, per_repeat, bar, met}}.
    Speed: tokens/s ratios per repeat (the two runs of a ratio ran in the same repeat); the machine
    limit: stage 0's model FLOP/s per rank over the limit measured before and after the runs (their
    mean; both are in the JSON). Memory: shardlm's peak RSS over the peer's at the same stage (one
    value: each is the largest of its repeats)."""
    by = {(r.system, r.stage): r for r in runs if not r.error and r.results}
    bars = {}

    def put(name, ratio, bar, higher=True):
        bars[name] = {**ratio, "bar": bar, "met": ratio["median"] >= bar if higher else ratio["median"] < bar}

    s0 = by.get(("shardlm", 0))
    for stage in (1, 2, 3):
        if s0 and ("shardlm", stage) in by:
            put(f"shardlm stage {stage} / stage 0 tok/s", paired_ratios(by[("shardlm", stage)], s0, args.warmup),
                BARS["stage_vs_stage0"])
    if s0 and machine:
        limit = statistics.mean(m["limit_flops_per_s"] for m in machine)
        flops_per_token = machine[0]["model_flops_per_rank_step"] / (args.micro_batch * args.seq_len)
        xs = [t / NPROC * flops_per_token / limit for t in s0.repeat_medians(args.warmup)]
        put("shardlm stage 0 FLOP/s / machine limit", {"median": statistics.median(xs), "min": min(xs),
                                                      "max": max(xs), "per_repeat": xs},
            BARS["stage0_vs_machine_limit"])
    for stage, peer in ((0, "torch-ddp"), (1, "deepspeed"), (2, "deepspeed"), (3, "deepspeed"), (3, "torch-fsdp2")):
        mine, other = by.get(("shardlm", stage)), by.get((peer, stage))
        if not mine or not other:
            continue
        bar = BARS["stage0_vs_torch-ddp"] if peer == "torch-ddp" else BARS[f"vs_{peer}"]
        put(f"shardlm stage {stage} / {peer} tok/s", paired_ratios(mine, other, args.warmup), bar)
        rss = max(max(res["rss"]) for res in mine.results) / max(max(res["rss"]) for res in other.results)
        put(f"shardlm stage {stage} / {peer} peak RSS", {"median": rss, "min": rss, "max": rss, "per_repeat": []},
            BARS["peak_rss_vs_peer"], higher=False)
    return bars


def print_bars(bars):
    print("issue 26's bars (median of the per-repeat ratios, their range in brackets):")
    for name, b in bars.items():
        rng = f" [{b['min']:.3f}-{b['max']:.3f}]" if b["per_repeat"] else ""
        print(f"  {name:<44} {b['median']:.3f}{rng:<16} {'<' if 'RSS' in name else '>='} {b['bar']:<5} "
              f"{'met' if b['met'] else 'MISSED'}")


# --------------------------------------------------------------------------- #
# The peers (run in spawned processes)
# --------------------------------------------------------------------------- #
def peer_main(spec_path):
    spawn_ranks(peer_rank, spec_path)


def build_hf_model(init_dir):
    """transformers' LlamaForCausalLM, eager attention, fp32, from shardlm's config.json and weights."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(init_dir)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).to(torch.float32)
    state = load_file(str(Path(init_dir) / "model.safetensors"))
    if cfg.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model


def torch_step(params, spec, clip):
    """step(loss) for the torch peers: backward, clip_grad_norm_, AdamW, zero_grad; returns the norm
    (FSDP2's is a DTensor, made whole)."""
    import torch

    opt = make_peer_optimizer(spec, params)

    def step(loss):
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    return step


def wrap_for(system, stage, model, spec):
    """(forward(inputs) -> logits, step(loss) -> grad_norm, ...): the system's training step around
    `model`. step(loss) runs backward, clipping, the optimizer step and zeroing gradients."""
    import torch

    clip = spec["train_config"]["gradient_clipping"]
    if system == "torch-ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=spec["train_config"]["ddp"]["bucket_cap_mb"])
        return ddp, torch_step(list(ddp.parameters()), spec, clip)

    if system == "torch-fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (spec["nproc"],))
        fully_shard(model.model.embed_tokens, mesh=mesh)  # shardlm's units: embedding, each layer,
        for layer in model.model.layers:                   # final norm + head (the root)
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch_step(list(model.parameters()), spec, clip)

    if system == "deepspeed":
        import deepspeed

        tc = spec["train_config"]
        # shardlm's resolved section names every key, mics_shard_size at -1 (off) too; the pinned
        # DeepSpeed removed MiCS and refuses that key at any value, so it goes when off. Sizes come
        # back as JSON numbers like 5e8; DeepSpeed's integer fields take them as integers (the
        # "no limit" 2^63 of stage3_model_persistence_threshold as its own sys.maxsize).
        zero = {k: min(int(v), sys.maxsize) if isinstance(v, float) and v.is_integer() else v
                for k, v in tc["zero_optimization"].items() if not (k == "mics_shard_size" and v <= 0)}
        zero["stage"] = stage
        ds_config = {
            "train_micro_batch_size_per_gpu": spec["micro_batch"],
            "gradient_accumulation_steps": 1,
            "train_batch_size": spec["micro_batch"] * spec["nproc"],
            "gradient_clipping": clip,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,  # the torch AdamW below
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        opt = make_peer_optimizer(spec, list(model.parameters()))
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)

        def step(loss):
            engine.backward(loss)
            engine.step()  # clipping, AdamW on this rank's partition, gathers, zero_grad
            norm = engine.get_global_grad_norm()
            return float(norm) if norm is not None else float("nan")
        return engine, step

    raise ValueError(f"unknown system {system}")


def peer_rank(rank, spec, port):
    N = spec["nproc"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(N),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(N), LOCAL_SIZE=str(N))
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    system, stage = spec["system"], spec["stage"]
    if system == "deepspeed":
        import deepspeed
        import deepspeed.comm.torch  # noqa: F401  (the module; the package's `torch` name is torch itself)

        # DeepSpeed's torch backend JIT-compiles a shared-memory all-reduce op (g++ + ninja, minutes
        # on 2 cores) when it starts on the CPU accelerator; only inference_all_reduce (tensor-parallel
        # inference) uses it, ZeRO training communicates through torch.distributed (gloo). Skip it.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo", rank=rank, world_size=N)

    model = build_hf_model(spec["init_dir"])
    module, step = wrap_for(system, stage, model, spec)

    tc = spec["train_config"]
    B, T = spec["micro_batch"], spec["seq_len"]
    batch = llmc_batches(REPO / tc["data"]["train"], rank, N, B, T)  # relative paths: to the repo

    rows = []
    for s in range(spec["steps"]):
        t0 = time.perf_counter()
        inputs, targets = batch(s)
        logits = module(input_ids=inputs, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        grad_norm = step(loss)
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum)  # global mean loss, as shardlm logs it
        dt = time.perf_counter() - t0
        rows.append({"step": s + 1, "loss": loss_sum.item() / N, "grad_norm": grad_norm,
                     "step_time_s": dt, "tokens_per_s": N * B * T / dt})

    rss = torch.tensor([0] * N, dtype=torch.int64)
    rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    dist.all_reduce(rss)
    if rank == 0:
        Path(spec["result"]).write_text(json.dumps({"rows": rows, "rss": rss.tolist()}))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- #
# The table
# --------------------------------------------------------------------------- #
def ratio(a, b, key):
    if a.get("error") or b is None or b.get("error"):
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def print_table(rows, args, n_params):
    print(f"\nmodel {args.model_desc} ({n_params / 1e6:.2f}M parameters) | {NPROC} ranks x 1 thread | "
          f"micro-batch {args.micro_batch} x seq {args.seq_len} per rank | {args.steps} steps, first "
          f"{args.warmup} dropped | {args.repeats} repeat(s), interleaved | fp32, AdamW lr {args.lr:g}")
    head = f"{'system':<12} {'stage':>5} {'tok/s':>8} {'step s':>8} {'step-1 loss':>12} {'peak RSS MB':>12}  note"
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["stage"], SYSTEMS.index(r["system"]))):
        if r.get("error"):
            print(f"{r['system']:<12} {r['stage']:>5} {'-':>8} {'-':>8} {'-':>12} {'-':>12}  ERROR: {r['error'][:300]}")
        else:
            print(f"{r['system']:<12} {r['stage']:>5} {r['tokens_per_s']:>8.0f} {r['step_time_s']:>8.3f} "
                  f"{r['step1_loss']:>12.7f} {r['peak_rss_bytes'] / MB:>12.1f}")
    print("-" * len(head))

    by = {(r["system"], r["stage"]): r for r in rows}
    print("shardlm / peer (tok/s > 1: shardlm faster; peak RSS < 1: shardlm smaller)")
    for stage, peers in ((0, ["torch-ddp"]), (1, ["deepspeed"]), (2, ["deepspeed"]), (3, ["deepspeed", "torch-fsdp2"])):
        mine = by.get(("shardlm", stage))
        for peer in peers:
            other = by.get((peer, stage))
            if mine is None or other is None:
                continue
            print(f"  stage {stage} vs {peer:<12} tok/s {ratio(mine, other, 'tokens_per_s'):>7}   "
                  f"peak RSS {ratio(mine, other, 'peak_rss_bytes'):>7}")


def check_losses(rows, rtol):
    """True when every successful row's step-1 loss is within rtol (relative) of every other's."""
    ok = [r for r in rows if not r.get("error")]
    if len(ok) < 2:
        print("step-1 loss check: fewer than two systems ran, nothing to compare")
        return len(ok) > 0
    ref = statistics.median(r["step1_loss"] for r in ok)
    lo, hi = min(ok, key=lambda r: r["step1_loss"]), max(ok, key=lambda r: r["step1_loss"])
    spread = (hi["step1_loss"] - lo["step1_loss"]) / abs(ref)
    good = spread <= rtol
    print(f"step-1 loss: spread {spread:.2e} relative over {len(ok)} runs (bound {rtol:g}): "
          + ("OK" if good else f"FAIL: {lo['system']} stage {lo['stage']} {lo['step1_loss']:.7f} vs "
                               f"{hi['system']} stage {hi['stage']} {hi['step1_loss']:.7f}"))
    last = [r["last_loss"] for r in ok]
    print(f"last-step loss: {min(last):.6f} .. {max(last):.6f}, spread {(max(last) - min(last)) / abs(ref):.2e} "
          f"relative (informational: it also compares the optimizers, but AdamW amplifies op-order noise)")
    return good


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS, quick_time="< 10 min on 2 cores")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results (machine, shape, load, rows, bars) as one JSON object to FILE")
    p.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    add_shardlm_arg(p)
    add_model_args(p, "shardlm config giving data, optimizer, clipping, seed (default configs/demo.json)")
    p.add_argument("--lr", type=float, help="constant learning rate (default: the config's optimizer lr)")
    p.add_argument("--loss-rtol", type=float, default=1e-5, help="allowed relative spread of step-1 losses")
    p.add_argument("--peer-malloc-keep", action="store_true",
                   help="give the Python peers shardlm's allocator policy (MALLOC_* environment)")
    p.add_argument("--timeout", type=int, default=900, help="seconds one run may take (default 900)")
    p.add_argument("--work-dir", type=Path, help="keep every run's files here (default: a temporary directory)")
    p.add_argument("--shape", choices=sorted(SHAPES),
                   help="issue 26's sizes: " + "; ".join(f"{k}: micro-batch {v['micro_batch']} x seq {v['seq_len']}, "
                                                         + " ".join(v["model_set"]) for k, v in SHAPES.items())
                        + " (explicit --micro-batch/--seq-len/--model-set win)")
    p.add_argument("--no-machine", action="store_true",
                   help="skip measuring the machine's GEMM and attention rates at the model's shapes before and "
                        "after the runs (no machine-limit bar then)")
    p.add_argument("--_peer", metavar="SPEC", help=argparse.SUPPRESS)  # internal: one peer job
    if "--_peer" in sys.argv:
        return p.parse_known_args()[0]
    shape = p.parse_known_args()[0].shape
    return parse_run_length_args(p, {**FULL_DEFAULTS, **SHAPES.get(shape, {})}, QUICK_DEFAULTS)


def main():
    args = parse_args()
    if args._peer:
        return peer_main(args._peer)
    require_modules("torch", "transformers", setup="bash scripts/setup.sh --peers")
    if not args.shardlm.exists():
        sys.exit(f"{args.shardlm} not found: build it first (bash scripts/build.sh) or pass --shardlm PATH")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if any(s not in SYSTEMS for s in only):
        sys.exit(f"--only: unknown system in {only}; choose from {', '.join(SYSTEMS)}")
    args.config = args.config.resolve()  # runs start in the repository root
    args.model_desc = args.model_preset + (" " + " ".join(args.model_set) if args.model_set else "")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="peers.")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.work = work
    args.binary = work / "shardlm"  # a rebuild of build/ during the run cannot mix two builds
    shutil.copy2(args.shardlm, args.binary)
    t_start = time.time()
    load = os.getloadavg()[0]
    print(f"load average before start: {load:.2f}"
          + ("  (other work is running: expect noisy numbers)" if load > 0.5 else ""), file=sys.stderr)

    args.init_dir = make_init(args, work)
    tc = json.loads((args.init_dir / "train_config.json").read_text())
    if args.lr is None:
        args.lr = json.loads(args.config.read_text()).get("optimizer", {}).get("params", {}).get("lr", 1e-3)
    tc["optimizer"]["params"]["lr"] = args.lr  # the probe ran with 0
    args.train_config = tc
    from safetensors import safe_open
    with safe_open(str(args.init_dir / "model.safetensors"), "pt") as f:
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())

    runs = []
    for stage in (0, 1, 2, 3):  # shardlm next to the peers of each stage
        if "shardlm" in only:
            runs.append(Run("shardlm", stage, lambda d, s=stage: run_shardlm(args, s, d)))
        peers = {0: ["torch-ddp"], 1: ["deepspeed"], 2: ["deepspeed"], 3: ["deepspeed", "torch-fsdp2"]}[stage]
        for peer in peers:
            if peer in only:
                runs.append(Run(peer, stage, lambda d, p=peer, s=stage: run_peer(args, p, s, d)))

    machine = [] if args.no_machine else [measure_machine(args, "before")]
    total, done = len(runs) * args.repeats, 0
    for rep in range(args.repeats):
        order = runs[rep % len(runs):] + runs[:rep % len(runs)]  # rotate: interleave
        for r in order:
            done += 1
            if r.error:
                continue
            t0 = time.time()
            try:
                r.results.append(r.launch(work / f"{r.system}.s{r.stage}.{rep}"))
                rows = r.results[-1]["rows"]
                med = statistics.median(x["tokens_per_s"] for x in rows if x["step"] > args.warmup)
                note = f"median {med:.0f} tok/s, step-1 loss {rows[0]['loss']:.6f}"
            except (SystemExit, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
                r.error = error_text(e)
                note = f"FAILED: {r.error}"
            print(f"[{done}/{total}] {r.label:<22} repeat {rep + 1}: {note} ({time.time() - t0:.0f} s)",
                  file=sys.stderr)

    load_runs_end = os.getloadavg()
    if machine:
        machine.append(measure_machine(args, "after"))
    rows = [r.row(args.warmup) for r in runs]
    print_table(rows, args, n_params)
    losses_ok = check_losses(rows, args.loss_rtol)
    for m in machine:
        print(f"machine limit ({m['when']} the runs): model {m['model_flops_per_rank_step'] / 1e9:.1f} GFLOP per "
              f"rank-step in {m['compute_s']:.3f} s of products and attention at their measured rates = "
              f"{m['limit_flops_per_s'] / 1e9:.1f} GFLOP/s per rank (fastest product shape "
              f"{m['gemm_peak_flops_per_s'] / 1e9:.1f}; attention forward {m['attention_flops_per_s']['forward'] / 1e9:.1f}, "
              f"backward {m['attention_flops_per_s']['backward'] / 1e9:.1f})")
    bars = evaluate_bars(runs, machine, args)
    print_bars(bars)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": {"cpu": machine[0]["description"] if machine else None, "cores": os.cpu_count(),
                        "limits": machine},
            "shape": {"model": args.model_desc, "parameters": n_params, "ranks": NPROC, "threads_per_rank": 1,
                      "micro_batch": args.micro_batch, "seq_len": args.seq_len, "steps": args.steps,
                      "warmup": args.warmup, "repeats": args.repeats, "dtype": "fp32"},
            "load_average": {"before": load, "after_runs": list(load_runs_end), "end": list(os.getloadavg())},
            "rows": rows, "bars": bars, "all_bars_met": all(b["met"] for b in bars.values()),
            "wall_time_s": time.time() - t_start}, indent=1) + "\n")
        print(f"results written to {args.json}")
    print(f"total wall time {time.time() - t_start:.0f} s; load average before {load:.2f}, "
          f"now {os.getloadavg()[0]:.2f}")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"per-run files are under {work}")
    failed = [r for r in rows if r.get("error")]
    if failed:
        print(f"{len(failed)} run(s) failed: " + ", ".join(f"{r['system']} stage {r['stage']}" for r in failed))
    if not losses_ok or failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
