"""Helpers shared by the benchmark scripts in bench/ - not a benchmark itself.

Why this file exists: the scripts here (ddp_vs_torch.py, zero_stages.py, peers.py, tp_vs_dp.py,
comm_speed.py, debug_checks.py, pipeline_schedules.py, gpu_peer.py, kill9_checkpoint.py) run shardlm
and PyTorch peers the same way - one environment policy, one way of starting, checking and killing a
run, one metrics.jsonl
reader, one set of run-length and model options, one llm.c data order and AdamW grouping for the
peers. Those helpers used to live in ddp_vs_torch.py, so every other script imported a benchmark
to get them; they live here now, and each script imports what it needs:

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import REPO, clean_env, run_checked  # noqa: E402

The module's top level imports only the standard library: gpu_peer.py imports it on the GPU
machine, whose Python environment is not /opt/shardlm/venv. torch and numpy are imported inside
the functions that need them. Importing it also puts tests/reference on sys.path (hf_llama for the
PyTorch peers).

The PyTorch DDP peer itself (the model, the training loop of every rank) stays in ddp_vs_torch.py,
the benchmark it belongs to; run_peer here starts it as `ddp_vs_torch.py --_peer SPEC`.
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
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

# The script whose --_peer mode is the PyTorch DDP peer (run_peer).
DDP_PEER_SCRIPT = Path(__file__).resolve().parent / "ddp_vs_torch.py"


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


def session_members(sid):
    """PIDs of the live (not zombie) processes of session `sid`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile
    return pids


def kill_session(sid, timeout_s=30):
    """SIGKILL to every process of session `sid` (a job started with start_new_session=True, whose
    pid is the session id), repeated until none is left alive: the ranks keep the session even where
    mpirun puts them in process groups of their own, so a kill of the process group can miss them
    (tests/integration/test_checkpoint.py kills the same way). Returns how many were killed."""
    killed, deadline = set(), time.monotonic() + timeout_s
    while True:
        alive = session_members(sid)
        if not alive:
            return len(killed)
        if time.monotonic() > deadline:
            sys.exit(f"session {sid}: processes {alive} still alive {timeout_s} s after SIGKILL")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass  # gone meanwhile
        time.sleep(0.01)


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


def run_peer(args, train_config, nproc, malloc_keep, out_dir, spec_extra=None):
    """Runs ddp_vs_torch.py in --_peer mode in a fresh process, so that the glibc variables take
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
    run_checked([sys.executable, str(DDP_PEER_SCRIPT), "--_peer", str(spec_path)], env,
                "PyTorch DDP peer" + (f" {spec_extra}" if spec_extra else ""))
    return read_metrics(spec["metrics"])


def read_metrics(path):
    """metrics.jsonl rows (shardlm's format; the peer writes the same keys)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- #
# PyTorch peers: processes, data, optimizer
# --------------------------------------------------------------------------- #
def spawn_ranks(rank_fn, spec_path):
    """Runs rank_fn(rank, spec, port) in spec["nproc"] processes, with a free rendezvous port."""
    import torch.multiprocessing as mp

    spec = json.loads(Path(spec_path).read_text())
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_fn, args=(spec, port), nprocs=spec["nproc"], join=True)


def load_llmc_tokens(path):
    """llm.c .bin: 256 int32 header (magic 20240520, version, token count), then uint16 tokens."""
    import numpy as np

    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520:
        raise SystemExit(f"{path}: not an llm.c token file (magic {header[0]})")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=256 * 4, shape=(int(header[2]),))


def llmc_batches(path, rank, nranks, B, T):
    """batch(micro_step) -> (inputs, targets) int64 [B, T] for this rank, in shardlm's DataLoader
    order: global sample k = m*N + r reads the window of B*T+1 tokens at (k mod S)*B*T, S = windows of
    B*T tokens in the file (data_loader.h)."""
    import torch

    tokens = load_llmc_tokens(path)
    windows = (len(tokens) - 1) // (B * T)

    def batch(micro_step):
        start = ((micro_step * nranks + rank) % windows) * B * T
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


# --------------------------------------------------------------------------- #
# Statistics
# --------------------------------------------------------------------------- #
class Config:
    """One timed configuration: run(out_dir) returns one run's metrics.jsonl rows; each repeat's
    rows are appended to .repeats."""

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


# --------------------------------------------------------------------------- #
# Environment check and command-line options
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
    p.add_argument("--shardlm", type=Path, default=SHARDLM,
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
