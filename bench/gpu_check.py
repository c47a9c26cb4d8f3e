#!/usr/bin/env python3
"""The Python half of scripts/gpu/gpu_check.sh: stage 0 (environment), stages 3-9 (parity, ZeRO, speed,
PyTorch peer, multi-rank, mixtures of experts, ZeRO-Offload), and the one JSON file, OUT/gpu_check.json, rewritten after every stage so
that it exists, with every stage reached so far, however the run ends.

    python3 bench/gpu_check.py env      --work W --out OUT [--rehearsal]
    python3 bench/gpu_check.py record   --work W --out OUT --stage NAME --status ok|failed|skipped
                                        [--reason TEXT] [--seconds S] [--data JSON]
    python3 bench/gpu_check.py stages   --work W --out OUT --shardlm BIN --deadline EPOCH_S [--rehearsal]
    python3 bench/gpu_check.py finalize --work W --out OUT

Stage records live in W/stages/NAME.json; run directories in W/runs/ (their small files are packed
into OUT/runs.tar.gz at the end). The JSON's "summary" holds the headline numbers and pass flags;
"stages" holds every stage's status, reason, seconds and numbers. `--rehearsal` (gpu_check.sh
--cpu-rehearsal) runs every stage with device cpu where cuda would be used and with small shapes,
to exercise the plumbing on a machine without a GPU; its numbers mean nothing.
Needs only the standard library, numpy and safetensors (the GPU machine's python3 has both).
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN_BIN = REPO / "data" / "brown" / "train.bin"
STAGE_ORDER = ["env", "deps", "build", "parity", "zero", "speed", "peer", "multirank", "moe", "offload"]
# most important first when time is short
RUN_ORDER = ["parity", "speed", "peer", "multirank", "zero", "offload", "moe"]
# Longest each stage may take on the H200 (s), and the least remaining time worth starting it with.
STAGE_CAP = {"parity": 90, "speed": 130, "peer": 90, "multirank": 80, "zero": 60, "moe": 50, "offload": 180}
STAGE_MIN = {"parity": 25, "speed": 45, "peer": 30, "multirank": 25, "zero": 20, "moe": 15, "offload": 20}
H200_BF16_DENSE_PEAK = 989e12  # NVIDIA's datasheet: H200 SXM dense bf16 (H100's Tensor Core rate)
SEED = 1234

# TinyLlama-1.1B's shape (the `llama-1b` preset).
LLAMA_1B = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
            "tie_word_embeddings": False}
TINY = {"preset": "tiny", "vocab_size": 4096}  # configs/tiny.json's model: the bundled corpus' vocabulary
# Tiny mixtures of experts (src/model/moe.h): on CUDA the expert products are at::_grouped_mm in bf16,
# a kernel the CPU never runs; Qwen2-MoE adds the shared expert and its sigmoid gate.
_MOE_BASE = {"vocab_size": 4096, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 128, "output_router_logits": True,
             "router_aux_loss_coef": 0.05}
TINY_MOE = {
    "mixtral": dict(_MOE_BASE, model_type="mixtral", intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(_MOE_BASE, model_type="qwen2_moe", intermediate_size=80, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False),
}

# Parity thresholds, CPU against CUDA, same seed, data and steps (20 steps of AdamW, lr 1e-2, tiny model).
# Step 1 (no optimizer step yet) is the tight test: both devices evaluate the same expressions in
# another order. fp32 (TF32 off: NVIDIA_TF32_OVERRIDE=0 and torch's default allow_tf32=False): one
# rounding is u = 6e-8, a dot product of length K <= 4096 (hidden 64, MLP 176, vocab 4096, batch*seq
# 256 in weight gradients) is off by ~sqrt(K)*u ~ 4e-6 at worst, the loss (a mean over 256 tokens
# of a 4096-way log-softmax) by less: 1e-5. The step-1 grad norm is a sum of squares in which
# cancelling contributions raise the relative error above sqrt(K)*u: 1e-4 (measured 7.8e-6 between
# 1-rank and 2-rank ZeRO-3 runs on CPU). bf16: every product is rounded to bf16 (u = 2^-9 = 2e-3) on
# both devices; where the fp32 accumulations differ by a rounding the bf16 results differ by one bf16
# ulp, and the CUDA kernels round in other places than the CPU path: step-1 loss 5e-3 (about one bf16
# ulp of the loss), grad norm 2e-2.
# Later steps are loose on purpose: AdamW's update m/sqrt(v) is scale-free, so an element whose
# gradient is ~0 moves by +-lr whatever its sign, and op-order noise flips such signs (embedding rows
# of rare tokens above all). Two correct fp32 implementations on one CPU, eager against sdpa
# attention, 10 steps, measured: loss 1.8e-6, grad norm 3.5e-4, weights 3.8e-3 norm-wise (embedding);
# bf16: loss 7.5e-4, grad norm 4.5e-2, weights 0.11 (q_proj). The limits below are ~10x those (for
# bf16 weights ~5x): they catch a wrong or missing update, not rounding.
PARITY_LIMITS = {
    "fp32": {"loss_step1_rel": 1e-5, "grad_norm_step1_rel": 1e-4, "loss_max_rel": 1e-4,
             "grad_norm_max_rel": 1e-2, "weights_max_normwise_rel": 5e-2},
    "bf16": {"loss_step1_rel": 5e-3, "grad_norm_step1_rel": 2e-2, "loss_max_rel": 2e-2,
             "grad_norm_max_rel": 0.3, "weights_max_normwise_rel": 0.5},
}
# Two ranks with half the micro-batch each see the same global batch as one rank (rank r of N at
# micro-step m reads the window at (m*N + r)*B*T): only the order of the sums differs (two
# half-batch GEMMs + an all-reduce instead of one), so fp32 limits as above. (Measured on CPU,
# tiny model, 6 steps: loss 1.4e-7, step-1 grad norm 7.8e-6 with ZeRO-3, weights 8.4e-6.)
MULTIRANK_LIMITS = PARITY_LIMITS["fp32"]
# ZeRO stages 1-3 on one rank against stage 0, bf16: the same arithmetic through other buffers
# (flat units, shards of size Psi); docs/zero-and-precision.md: fp32 to 3e-7. bf16 leaves room for one rounding placed
# differently per step.
ZERO_LIMITS = {"loss_max_rel": 1e-2, "weights_max_normwise_rel": 1e-2}
# ZeRO-Offload (offload_optimizer cpu) against the same CUDA run without it, bf16, ZeRO stage 2. The
# gradients, the norm and the clipping are the device's in both; only AdamW's fp32 arithmetic moves
# from CUDA kernels to the CPU. Both evaluate the same IEEE expressions, but nvcc contracts a*b+c into
# one fused multiply-add where the CPU's vectorized loops round twice, so a master may differ in its
# last fp32 bit (6e-8 relative). The bf16 parameters cast from the masters are then equal except where
# a master sits within that bit of a bf16 rounding boundary (about 2^-16 of the elements per step),
# which moves one bf16 ulp (4e-3) in a handful of elements: the losses are expected bitwise equal or
# within ~1e-5; the limits are ZERO_LIMITS (a missing or wrong update moves them by far more). Whether
# they were bitwise equal is recorded beside. offload_optimizer nvme (the states streamed from files
# through the host, the same CPU step) is held to the same limits.
OFFLOAD_LIMITS = ZERO_LIMITS
# bf16 master weights (optimizer.master_precision "bf16", Kahan summation) through the host optimizer,
# against the same CUDA run with fp32 masters: not the same arithmetic, so no bitwise claim (on the CPU
# the same run is bit-identical to bf16 masters without offload: tests/mpi/test_bf16_masters.cpp). The
# losses follow closely; the weights less so: Adam's first steps move an element by about lr·sign(g), so
# where g is near zero a rounding that differs flips the step, and the saved weights are bf16 against
# fp32 (CPU rehearsal, tiny model, 5 steps at lr 1e-2: loss 2.1e-4, weights 1.5e-2 normwise). A missing
# or wrong update moves the loss by far more (the rehearsal's loss falls 12% over those 5 steps).
BF16_MASTER_LIMITS = {"loss_max_rel": 1e-2, "weights_max_normwise_rel": 5e-2}


# --------------------------------------------------------------------------------------------- #
# Records and the merged JSON
# --------------------------------------------------------------------------------------------- #
def stage_file(work, name):
    return Path(work) / "stages" / f"{name}.json"


def write_json(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


def record(work, out, name, status, reason="", seconds=None, data=None):
    rec = {"status": status, "reason": reason}
    if seconds is not None:
        rec["seconds"] = round(float(seconds), 2)
    rec.update(data or {})
    write_json(stage_file(work, name), rec)
    merge(work, out)
    line = f"[gpu_check] stage {name}: {status}" + (f" ({reason})" if reason else "")
    print(line, flush=True)
    return rec


def load_stages(work):
    stages = {}
    for name in STAGE_ORDER:
        p = stage_file(work, name)
        if p.exists():
            try:
                stages[name] = json.loads(p.read_text())
            except ValueError as e:
                stages[name] = {"status": "failed", "reason": f"unreadable record: {e}"}
        else:
            stages[name] = {"status": "not reached", "reason": "the run ended before this stage"}
    return stages


def meta(work):
    p = Path(work) / "meta.json"
    return json.loads(p.read_text()) if p.exists() else {}


def merge(work, out, final=False):
    stages = load_stages(work)
    m = meta(work)
    doc = {"schema": "shardlm-gpu-check/1", **m, "finished": final,
           "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "summary": summarize(stages, m), "stages": stages}
    if m.get("started_epoch"):
        doc["elapsed_s"] = round(time.time() - m["started_epoch"], 1)
    write_json(Path(out) / "gpu_check.json", doc)
    return doc


def get(d, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def summarize(stages, m):
    s = {"status": {k: v.get("status") for k, v in stages.items()}}
    s["parity_pass"] = get(stages, "parity", "pass")
    for prec in ("fp32", "bf16"):
        comps = get(stages, "parity", "comparisons", prec) or {}
        for attn, c in comps.items():
            for k in ("loss_step1_rel", "loss_max_rel", "weights_max_normwise_rel"):
                s[f"parity_{prec}_{attn}_{k}"] = c.get(k)
    s["zero_pass"] = get(stages, "zero", "pass")
    sp = stages.get("speed", {})
    peer = stages.get("peer", {})
    s["speed_model"] = get(sp, "model_name")
    s["speed_micro_batch"] = get(sp, "micro_batch")
    s["shardlm_tokens_per_s"] = get(sp, "tokens_per_s_mean")
    s["peer_tokens_per_s"] = get(peer, "tokens_per_s_mean")
    if s["shardlm_tokens_per_s"] and s["peer_tokens_per_s"]:
        s["shardlm_over_peer_tokens_per_s"] = round(s["shardlm_tokens_per_s"] / s["peer_tokens_per_s"], 4)
    fpt = get(sp, "flops", "per_token")
    gemm = get(peer, "gemm", "tflops")
    s["gemm_bf16_tflops_measured"] = gemm
    if fpt and s["shardlm_tokens_per_s"]:
        achieved = fpt * s["shardlm_tokens_per_s"]
        s["shardlm_tflops"] = round(achieved / 1e12, 2)
        s["shardlm_mfu_vs_989"] = round(achieved / H200_BF16_DENSE_PEAK, 4)
        if gemm:
            s["shardlm_mfu_vs_measured_gemm"] = round(achieved / (gemm * 1e12), 4)
    if fpt and s["peer_tokens_per_s"]:
        achieved = fpt * s["peer_tokens_per_s"]
        s["peer_mfu_vs_989"] = round(achieved / H200_BF16_DENSE_PEAK, 4)
        if gemm:
            s["peer_mfu_vs_measured_gemm"] = round(achieved / (gemm * 1e12), 4)
    s["shardlm_peak_allocated_bytes"] = get(sp, "memory", "device_peak_allocated")
    s["planned_total_bytes"] = get(sp, "plan", "total")
    s["peak_over_plan"] = get(sp, "peak_over_plan")
    s["peer_peak_allocated_bytes"] = get(peer, "max_memory_allocated")
    if s["shardlm_peak_allocated_bytes"] and s["peer_peak_allocated_bytes"]:
        s["shardlm_over_peer_peak_memory"] = round(s["shardlm_peak_allocated_bytes"] / s["peer_peak_allocated_bytes"], 4)
    s["moe_pass"] = get(stages, "moe", "pass")
    s["offload_pass"] = get(stages, "offload", "pass")
    s["offload_losses_bitwise_equal"] = get(stages, "offload", "vs_no_offload", "bitwise_equal_losses")
    s["offload_step_time_over_no_offload"] = get(stages, "offload", "step_time_ratio")
    s["offload_host_bytes"] = get(stages, "offload", "runs_detail", "offload", "memory", "host")
    s["offload_nvme_losses_bitwise_equal"] = get(stages, "offload", "nvme_vs_no_offload", "bitwise_equal_losses")
    s["offload_nvme_step_time_over_no_offload"] = get(stages, "offload", "nvme_step_time_ratio")
    s["param_offload_losses_bitwise_equal"] = get(stages, "offload", "param_offload_vs_no_offload",
                                                  "bitwise_equal_losses")
    s["param_offload_shards_on_host"] = get(stages, "offload", "param_shards_on_host")
    s["offload_bf16_masters_loss_max_rel"] = get(stages, "offload", "bf16_masters_vs_fp32_masters", "loss_max_rel")
    s["offload_bf16_masters_on_host"] = get(stages, "offload", "bf16_masters_on_host")
    s["offload_bf16_param_masters_held_once"] = get(stages, "offload", "bf16_param_masters_held_once")
    s["infinity_losses_bitwise_equal"] = get(stages, "offload", "infinity_vs_no_offload", "bitwise_equal_losses")
    s["infinity_on_disk"] = get(stages, "offload", "infinity_on_disk")
    s["infinity_step_time_over_no_offload"] = get(stages, "offload", "infinity_step_time_ratio")
    s["multirank_mpi_pass"] = get(stages, "multirank", "mpi_2_ranks", "pass")
    s["multirank_zero3_pass"] = get(stages, "multirank", "mpi_2_ranks_zero3", "pass")
    s["nccl_2_ranks_one_gpu_fails_fast"] = get(stages, "multirank", "nccl_2_ranks", "failed_fast")
    s["untested"] = get(stages, "multirank", "untested")
    flags = [s["parity_pass"], s["zero_pass"], s["multirank_mpi_pass"]]
    s["all_ok"] = all(v.get("status") == "ok" for v in stages.values()) and all(f is True for f in flags)
    return s


# --------------------------------------------------------------------------------------------- #
# Stage 0: the environment
# --------------------------------------------------------------------------------------------- #
def sh(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip() if p.returncode == 0 else f"(exit {p.returncode}) {(p.stdout + p.stderr).strip()[-300:]}"
    except subprocess.TimeoutExpired:
        return f"(timed out after {timeout}s)"


def stage_env(args):
    t0 = time.time()
    write_json(Path(args.work) / "meta.json", {
        "mode": "cpu-rehearsal" if args.rehearsal else "gpu",
        "started_epoch": args.started or time.time(),
        "budget_s": args.budget,
        "git_commit": sh(f"git -C {REPO} rev-parse HEAD"),
        "git_dirty_files": len([ln for ln in sh(f"git -C {REPO} status --porcelain").splitlines() if ln.strip()]),
        "host": os.uname().nodename,
    })
    probe = ("import json, torch; c = torch.cuda.is_available(); "
             "print(json.dumps({'torch': torch.__version__, 'cuda_runtime': torch.version.cuda, "
             "'cuda_available': c, 'device_name': torch.cuda.get_device_name() if c else None, "
             "'device_count': torch.cuda.device_count(), "
             "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None, "
             "'cmake_prefix_path': torch.utils.cmake_prefix_path, "
             "'matmul_allow_tf32': torch.backends.cuda.matmul.allow_tf32}))")
    torch_info = sh(f"{sys.executable} -c \"{probe}\"", timeout=90)
    try:
        torch_info = json.loads(torch_info.splitlines()[-1])
    except (ValueError, IndexError):
        pass
    data = {
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "torch": torch_info,
        "nproc": os.cpu_count(),
        "os": sh("grep -m1 PRETTY_NAME /etc/os-release | cut -d= -f2 | tr -d '\"'"),
        "kernel": os.uname().release,
        "memory": sh("free -g | awk '/Mem:/ {print $2 \" GiB total, \" $7 \" GiB available\"}'"),
        "nvidia_smi": sh("nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,"
                         "power.limit --format=csv,noheader") if shutil.which("nvidia-smi") else None,
        "nvcc": sh("nvcc --version | tail -2 | head -1") if shutil.which("nvcc") else None,
        "gxx": sh("g++ --version | head -1") if shutil.which("g++") else None,
        "cmake": sh("cmake --version | head -1") if shutil.which("cmake") else None,
        "ninja": sh("ninja --version") if shutil.which("ninja") else None,
        "system_mpirun": sh("mpirun --version 2>&1 | head -1") if shutil.which("mpirun") else None,
        "mpi4py": sh(f"{sys.executable} -c 'import mpi4py; print(mpi4py.__version__)'"),
        "tf32_env": {k: os.environ.get(k) for k in ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")},
    }
    ok = isinstance(torch_info, dict) and (args.rehearsal or torch_info.get("cuda_available"))
    reason = "" if ok else ("torch did not load" if not isinstance(torch_info, dict) else "torch sees no GPU")
    record(args.work, args.out, "env", "ok" if ok else "failed", reason, time.time() - t0, data)
    for k, v in data.items():
        print(f"  {k}: {v}")
    return 0


# --------------------------------------------------------------------------------------------- #
# Running shardlm
# --------------------------------------------------------------------------------------------- #
class Result:
    def __init__(self, rc, output, seconds, timed_out):
        self.rc, self.output, self.seconds, self.timed_out = rc, output, seconds, timed_out

    def tail(self, n=8):
        lines = [ln for ln in self.output.splitlines() if ln.strip()]
        return "\n".join(lines[-n:])

    def error_line(self):
        """The most telling line of a failed command's output."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        for pat in ("error:", "Error", "ERROR", "what():", "Traceback", "not found", "refused", "failed"):
            hits = [ln for ln in lines if pat in ln]
            if hits:
                return hits[-1][:400] if pat != "Traceback" else lines[-1][:400]
        if self.timed_out:
            return f"timed out after {self.seconds:.0f}s"
        return (lines[-1][:400] if lines else f"exit {self.rc}")


CHILD = {"pgid": None}  # the running command's process group, killed if we are terminated


def on_sigterm(signum, _frame):
    if CHILD["pgid"]:
        try:
            os.killpg(CHILD["pgid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise SystemExit(f"gpu_check.py: terminated by signal {signum}")


def run_cmd(cmd, timeout, env=None, cwd=REPO, echo_lines=40):
    """Runs cmd in its own process group (mpirun's ranks die with it on timeout); output to the log."""
    cmd = [str(c) for c in cmd]
    print(f"$ {' '.join(cmd)}  (timeout {timeout:.0f}s)", flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, errors="replace")
    CHILD["pgid"] = p.pid
    timed_out = False
    try:
        out, _ = p.communicate(timeout=max(1, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out = ""
    CHILD["pgid"] = None
    secs = time.time() - t0
    lines = out.splitlines()
    shown = lines if len(lines) <= echo_lines else [f"  ... ({len(lines) - echo_lines} lines)"] + lines[-echo_lines:]
    for ln in shown:
        print(f"  | {ln}")
    print(f"  -> exit {p.returncode}{' (TIMED OUT)' if timed_out else ''} in {secs:.1f}s", flush=True)
    return Result(p.returncode if not timed_out else 124, out, secs, timed_out)


def read_jsonl(path):
    try:
        return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return []


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class Run:
    """One `shardlm train` in W/runs/NAME."""

    def __init__(self, name, dir_, res, dropped, cmd):
        self.name, self.dir, self.res, self.dropped, self.cmd = name, Path(dir_), res, dropped, cmd
        self.metrics = read_jsonl(self.dir / "metrics.jsonl")
        self.memory = read_json(self.dir / "memory.json")
        self.plan = read_json(self.dir / "plan.json")
        self.train_config = read_json(self.dir / "train_config.json")

    @property
    def ok(self):
        return self.res.rc == 0 and bool(self.metrics)

    def losses(self):
        return [r.get("loss") for r in self.metrics]

    def grad_norms(self):
        return [r.get("grad_norm") for r in self.metrics]

    def brief(self):
        d = {"run": self.name, "ok": self.ok, "exit": self.res.rc, "seconds": round(self.res.seconds, 1)}
        if self.dropped:
            d["dropped_keys"] = self.dropped
        if not self.ok:
            d["error"] = self.res.error_line()
        if self.metrics:
            d["steps"] = len(self.metrics)
            d["loss_first"], d["loss_last"] = self.metrics[0].get("loss"), self.metrics[-1].get("loss")
        return d


def base_config(model, micro_batch, seq_len, steps, *, bf16=False, stage=0, lr=1e-2, log_interval=None,
                threads=None):
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "constant"},
        "model": dict(model),
        "data": {"train": str(TRAIN_BIN), "val": "", "seq_len": seq_len},
        "steps": steps,
        "seed": SEED,
        "eval_interval": 0,
        "log_interval": log_interval or max(1, steps // 4),
        "resume": False,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bool(bf16)},
    }
    if threads:
        cfg["threads"] = threads
    return cfg


class Check:
    def __init__(self, args):
        self.args = args
        self.work, self.out = Path(args.work), Path(args.out)
        self.runs = self.work / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.bin = Path(args.shardlm).resolve() if args.shardlm else None
        self.rehearsal = args.rehearsal
        self.dev = "cpu" if self.rehearsal else "cuda"
        self.deadline = args.deadline
        self.supported = set()
        self.probe_notes = {}
        self.mpirun = shutil.which("mpirun")
        self.base_env = {k: v for k, v in os.environ.items() if k != "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"}
        # cuBLAS: never TF32 for fp32 GEMMs, whatever the library's defaults (it also honours this
        # for bf16 runs, where it changes nothing).
        self.base_env["NVIDIA_TF32_OVERRIDE"] = "0"
        self.base_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        # One run on the machine: an NCCL setup failure must explain itself in the log.
        self.base_env.setdefault("NCCL_DEBUG", "WARN")

    def remaining(self):
        return self.deadline - time.time()

    # -- feature probe ------------------------------------------------------------------------ #
    def probe(self):
        """Which of the new config keys this binary accepts: a config load that stops at steps=0
        after every key parsed ('unknown config key' names the first key it does not know)."""
        cfg = base_config(TINY, 1, 8, 1)
        cfg["steps"] = 0
        path = self.work / "probe_config.json"
        write_json(path, cfg)
        want = {"device": self.dev, "comm.backend": "mpi", "attn_implementation": "eager",
                "parallelism.tensor_parallel": 1, "data.prefetch": 0}
        left = dict(want)
        for _ in range(len(want) + 1):
            res = run_cmd([self.bin, "train", "--config", path, *[f"--{k}={v}" for k, v in left.items()]], 60,
                          self.base_env, echo_lines=3)
            m = re.search(r"unknown config key '([^']+)'", res.output)
            key = m.group(1) if m else None
            if key is not None and key not in left:  # an unknown section: the key inside it
                key = next((k for k in left if k.startswith(key + ".")), key)
            if key not in left:
                if m:
                    self.probe_notes["unexpected"] = res.error_line()
                break
            del left[key]
        self.supported = set(left)
        res = run_cmd([self.bin, "train", "--config", path, "--model.preset=llama-1b"], 60, self.base_env, echo_lines=3)
        self.llama_1b_preset = "unknown model preset" not in res.output
        self.probe_notes.update(supported_keys=sorted(self.supported), missing_keys=sorted(set(want) - self.supported),
                                llama_1b_preset=self.llama_1b_preset)
        print(f"[gpu_check] binary accepts: {sorted(self.supported)}; lacks: {sorted(set(want) - self.supported)}; "
              f"llama-1b preset: {self.llama_1b_preset}", flush=True)

    # -- one training run --------------------------------------------------------------------- #
    def train(self, name, cfg, keys, timeout, nproc=1, env=None):
        d = self.runs / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        cfg = dict(cfg, out_dir=str(d))
        cfg_path = self.runs / f"{name}.config.json"
        write_json(cfg_path, cfg)
        dropped = [k for k, v in keys.items() if v is not None and k not in self.supported]
        ov = [f"--{k}={v}" for k, v in keys.items() if v is not None and k in self.supported]
        cmd = [self.bin, "train", "--config", cfg_path, *ov]
        if nproc > 1:
            if not self.mpirun:
                return Run(name, d, Result(127, "mpirun not found on PATH", 0, False), dropped, cmd)
            cmd = [self.mpirun, "--allow-run-as-root", "-np", str(nproc), "--oversubscribe", "--bind-to", "none", *cmd]
        timeout = min(timeout, max(1, self.remaining() - 5))
        res = run_cmd(cmd, timeout, dict(self.base_env, **(env or {})))
        (d / "output.txt").write_text(res.output[-200_000:])
        return Run(name, d, res, dropped, [str(c) for c in cmd])

    # -- stage driver ------------------------------------------------------------------------- #
    def run_stage(self, name, fn):
        left = self.remaining()
        if left < STAGE_MIN[name]:
            return record(self.work, self.out, name, "skipped", f"time budget: {left:.0f}s left, stage needs "
                                                                f">= {STAGE_MIN[name]}s")
        stage_deadline = time.time() + min(STAGE_CAP[name] * (4 if self.rehearsal else 1), left - 5)
        saved, self.deadline = self.deadline, stage_deadline
        t0 = time.time()
        try:
            status, reason, data = fn()
        except Exception as e:  # a bug here must not lose the other stages
            import traceback
            traceback.print_exc()
            status, reason, data = "failed", f"gpu_check.py: {type(e).__name__}: {e}", {}
        except BaseException as e:  # terminated: record why, then stop
            record(self.work, self.out, name, "failed", f"interrupted: {e}", time.time() - t0, {})
            raise
        finally:
            self.deadline = saved
        return record(self.work, self.out, name, status, reason, time.time() - t0, data)

    # ---------------------------------------------------------------------------------------- #
    # Stage 3: parity, CPU against CUDA
    # ---------------------------------------------------------------------------------------- #
    def stage_parity(self):
        steps = 10 if self.rehearsal else 20
        data = {"model": TINY, "micro_batch": 4, "seq_len": 64, "steps": steps, "lr": 1e-2,
                "limits": PARITY_LIMITS, "tf32": "off: NVIDIA_TF32_OVERRIDE=0, torch allow_tf32 default False",
                "runs": [], "comparisons": {}}
        attn_variants = ["eager", "sdpa"] if "attn_implementation" in self.supported else [None]
        if self.rehearsal:
            data["note"] = "rehearsal: the 'cuda' side is device cpu with threads=1 (the reference uses all cores)"
        passes, failures = [], []
        for prec in ("fp32", "bf16"):
            cfg = base_config(TINY, 4, 64, steps, bf16=(prec == "bf16"))
            ref = self.train(f"parity_{prec}_cpu", cfg, {"device": "cpu", "attn_implementation": "eager"}, 60)
            data["runs"].append(ref.brief())
            data["comparisons"][prec] = {}
            if not ref.ok:
                failures.append(f"{prec} cpu run failed: {ref.brief().get('error')}")
                continue
            for attn in attn_variants:
                dcfg = dict(cfg, threads=1) if self.rehearsal else cfg
                dev = self.train(f"parity_{prec}_{self.dev}_{attn or 'auto'}", dcfg,
                                 {"device": self.dev, "attn_implementation": attn}, 60)
                data["runs"].append(dev.brief())
                key = attn or "auto"
                if not dev.ok:
                    failures.append(f"{prec} {self.dev} {key} run failed: {dev.brief().get('error')}")
                    continue
                c = judged(ref, dev, PARITY_LIMITS[prec])
                data["comparisons"][prec][key] = c
                passes.append(c["pass"])
                print(f"[gpu_check] parity {prec} cpu vs {self.dev}/{key}: loss step1 {c['loss_step1_rel']:.2e} "
                      f"max {c['loss_max_rel']:.2e}, grad norm max {c['grad_norm_max_rel']:.2e}, weights "
                      f"{c['weights_max_normwise_rel']:.2e} -> {'pass' if c['pass'] else 'FAIL ' + str(c['limits_exceeded'])}",
                      flush=True)
            # The prefetch thread copies batches on its own CUDA stream (src/data/loader/prefetch.h): batches read on
            # the step's thread (data.prefetch=0) must give the very same numbers.
            if prec == "fp32" and "data.prefetch" in self.supported and dev.ok:
                dcfg = dict(cfg, threads=1) if self.rehearsal else cfg
                d0 = self.train(f"parity_fp32_{self.dev}_prefetch0", dcfg,
                                {"device": self.dev, "attn_implementation": attn_variants[-1], "data.prefetch": 0}, 60)
                same = d0.ok and d0.losses() == dev.losses() and d0.grad_norms() == dev.grad_norms()
                data["comparisons"]["prefetch_0_vs_2_bit_identical"] = same
                passes.append(same)
                print(f"[gpu_check] prefetch 0 vs 2 on {self.dev}: bit-identical {same}", flush=True)
            if self.remaining() < 10:
                failures.append("stage time cap reached")
                break
        data["pass"] = bool(passes) and all(passes) and not failures
        if failures:
            return "failed", join_failures(failures), data
        return "ok", "" if data["pass"] else "ran; some differences exceed the limits (see comparisons)", data

    # ---------------------------------------------------------------------------------------- #
    # Stage 4: ZeRO stages 0-3 on one rank (CUDA, bf16)
    # ---------------------------------------------------------------------------------------- #
    def stage_zero(self):
        if self.rehearsal:
            model, B, T, steps = TINY, 4, 64, 5
        else:
            model, B, T, steps = {"preset": "demo"}, 8, 128, 10
        data = {"model": model, "micro_batch": B, "seq_len": T, "steps": steps, "precision": "bf16",
                "limits": ZERO_LIMITS, "stages": {}}
        runs = {}
        for s in range(4):
            cfg = base_config(model, B, T, steps, bf16=True, stage=s)
            r = self.train(f"zero_stage{s}", cfg, {"device": self.dev}, 60)
            runs[s] = r
            entry = r.brief()
            mem = r.memory or {}
            entry["memory"] = {k: mem.get(k) for k in (
                "compute_params", "gradients", "master_params", "optimizer_states", "total_model_states",
                "gathered_peak", "parameters", "device_peak_allocated", "device_peak_reserved",
                "device_allocated_after_init")}
            entry["planned"] = plan_entry(r.plan, s)
            data["stages"][str(s)] = entry
            if self.remaining() < 8:
                break
        if not runs.get(0) or not runs[0].ok:
            return "failed", "stage 0 run failed: " + (runs[0].brief().get("error", "") if 0 in runs else "?"), data
        passes, failures = [], []
        for s in (1, 2, 3):
            r = runs.get(s)
            if r is None:
                failures.append(f"stage {s} not run (time)")
                continue
            if not r.ok:
                failures.append(f"stage {s} failed: {r.brief().get('error')}")
                continue
            c = compare(runs[0], r)
            c["bitwise_equal_losses"] = runs[0].losses() == r.losses()
            c["pass"] = all(c.get(k) is not None and c[k] <= lim for k, lim in ZERO_LIMITS.items())
            data["stages"][str(s)]["vs_stage0"] = c
            passes.append(c["pass"])
        data["pass"] = bool(passes) and all(passes) and not failures
        if failures:
            return "failed", join_failures(failures), data
        return "ok", "" if data["pass"] else "ran; stages differ from stage 0 beyond the limits", data

    # ---------------------------------------------------------------------------------------- #
    # Stage 5: speed (llama-1b, bf16, seq 2048)
    # ---------------------------------------------------------------------------------------- #
    def speed_setup(self):
        if self.rehearsal:
            return {"model": TINY, "name": "tiny (rehearsal)", "B": 4, "T": 128, "steps": 8, "warmup": 2}
        if self.llama_1b_preset:
            model, name = {"preset": "llama-1b"}, "llama-1b preset"
        else:
            model, name = {"preset": "llama-7b", **LLAMA_1B}, "llama-7b preset with TinyLlama-1.1B's fields"
        # sdpa keeps no heads x T^2 probabilities: B=8 (16k tokens) needs ~50 GB; the eager path
        # would keep 32 x 2048^2 x 4 B x 8 = 4.3 GB per layer, 94 GB for 22 layers: B=4 then.
        B = int(os.environ.get("GPU_CHECK_SPEED_MB") or (8 if "attn_implementation" in self.supported else 4))
        return {"model": model, "name": name, "B": B, "T": 2048, "steps": 30, "warmup": 5}

    def stage_speed(self):
        su = self.speed_setup()
        data = {"model_name": su["name"], "seq_len": su["T"], "steps": su["steps"], "warmup_steps": su["warmup"],
                "precision": "bf16", "zero_stage": 0, "attempts": []}
        B = su["B"]
        while True:
            cfg = base_config(su["model"], B, su["T"], su["steps"], bf16=True, lr=3e-4, log_interval=5)
            r = self.train(f"speed_b{B}", cfg, {"device": self.dev, "attn_implementation": "sdpa" if not self.rehearsal else None},
                           STAGE_CAP["speed"] * (4 if self.rehearsal else 1))
            data["attempts"].append(r.brief())
            oom = "out of memory" in r.res.output.lower()
            if r.ok or not oom or B <= 1 or self.remaining() < 40:
                break
            B //= 2  # the plan was wrong about the activations: halve once more and say so
        data["micro_batch"] = B
        self.speed_run = r
        # big files are not wanted in the tarball nor on disk
        for f in ("model.safetensors",):
            (r.dir / f).unlink(missing_ok=True)
        if not r.ok:
            return "failed", f"shardlm speed run failed: {r.brief().get('error')}", data
        tc = r.train_config or {}
        model = tc.get("model", {})
        data["resolved_model"] = {k: model.get(k) for k in LLAMA_1B} if model else None
        if not self.rehearsal:
            data["shape_is_tinyllama"] = all(model.get(k) == v for k, v in LLAMA_1B.items())
        rows = r.metrics
        measured = [x for x in rows if x.get("step", 0) > su["warmup"]] or rows
        times = [x["step_time_s"] for x in measured if x.get("step_time_s")]
        tokens_per_step = B * su["T"]
        data.update(
            tokens_per_step=tokens_per_step,
            measured_steps=len(times),
            step_time_s_median=median(times),
            tokens_per_s_mean=tokens_per_step * len(times) / sum(times) if times else None,
            tokens_per_s_median=median([x.get("tokens_per_s") for x in measured if x.get("tokens_per_s")]),
            step_times_s=[x.get("step_time_s") for x in rows],
            losses=[x.get("loss") for x in rows],
            loss_first=rows[0].get("loss"), loss_last=rows[-1].get("loss"),
            finite=all(isinstance(x.get("loss"), (int, float)) and math.isfinite(x["loss"]) for x in rows),
        )
        mem = r.memory or {}
        data["memory"] = {k: mem.get(k) for k in (
            "parameters", "total_model_states", "compute_params", "gradients", "master_params", "optimizer_states",
            "activations_measured", "device_peak_allocated", "device_peak_reserved", "device_allocated_after_init")}
        data["plan"] = plan_entry(r.plan, 0)
        peak, planned = mem.get("device_peak_allocated"), (data["plan"] or {}).get("total")
        if peak and planned:
            data["peak_over_plan"] = round(peak / planned, 4)
        data["flops"] = flops_per_token(model or LLAMA_1B, su["T"], mem.get("parameters"))
        fpt = data["flops"]["per_token"]
        if data["tokens_per_s_mean"]:
            achieved = fpt * data["tokens_per_s_mean"]
            data["tflops"] = achieved / 1e12
            data["mfu_vs_989"] = achieved / H200_BF16_DENSE_PEAK
            data["mfu_vs_989_excluding_embedding_lookup"] = (
                data["flops"]["per_token_excluding_embedding_lookup"] * data["tokens_per_s_mean"] / H200_BF16_DENSE_PEAK)
            # MFU against the GEMM peak measured by the peer stage: summary.shardlm_mfu_vs_measured_gemm
        print(f"[gpu_check] speed: {data['tokens_per_s_mean']:.0f} tok/s (mean over {len(times)} steps), "
              f"MFU {data.get('mfu_vs_989', 0):.3f} of 989 TFLOP/s, peak {fmt_bytes(peak)} vs plan {fmt_bytes(planned)}",
              flush=True)
        return "ok", "" if data["finite"] else "non-finite loss", data

    # ---------------------------------------------------------------------------------------- #
    # Stage 6: the PyTorch peer (and the GEMM peak)
    # ---------------------------------------------------------------------------------------- #
    def stage_peer(self):
        su = self.speed_setup()
        r = getattr(self, "speed_run", None)
        tc_path = r.dir / "train_config.json" if r is not None and r.train_config else None
        B = r.train_config["train_micro_batch_size_per_gpu"] if tc_path else su["B"]
        if tc_path is None:  # shardlm did not get that far: the peer still measures, with our own spec
            tc_path = self.work / "peer_train_config.json"
            model = dict(LLAMA_1B) if not self.rehearsal else {  # the tiny preset's fields
                "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
            cfg = base_config(model, B, su["T"], su["steps"], bf16=True, lr=3e-4)
            write_json(tc_path, cfg)
        out_json = self.work / "peer.json"
        out_json.unlink(missing_ok=True)
        cmd = [sys.executable, REPO / "bench" / "gpu_peer.py", "--train-config", tc_path, "--device", self.dev,
               "--steps", su["steps"], "--warmup", su["warmup"], "--json", out_json]
        if self.rehearsal:
            cmd += ["--gemm-n", "256"]
        # The peer is plain PyTorch: without the carried Debian libraries first on the library path.
        env = dict(self.base_env, PYTHONUNBUFFERED="1")
        if "GPU_CHECK_ORIG_LD_LIBRARY_PATH" in env:
            env["LD_LIBRARY_PATH"] = env["GPU_CHECK_ORIG_LD_LIBRARY_PATH"]
        res = run_cmd(cmd, max(1, self.remaining() - 2), env)
        peer = read_json(out_json)
        if res.rc != 0 or not peer:
            return "failed", f"peer failed: {res.error_line()}", {"exit": res.rc}
        for k in ("losses", "grad_norms"):
            peer[k] = [round(v, 6) for v in peer.get(k, [])]
        data = dict(peer)
        data["same_batch_as_shardlm"] = bool(r is not None and r.train_config)
        sp = load_stages(self.work).get("speed", {})
        if sp.get("tokens_per_s_mean") and peer.get("tokens_per_s_mean"):
            data["shardlm_over_peer_tokens_per_s"] = sp["tokens_per_s_mean"] / peer["tokens_per_s_mean"]
        peak = get(sp, "memory", "device_peak_allocated")
        if peak and peer.get("max_memory_allocated"):
            data["shardlm_over_peer_peak_memory"] = peak / peer["max_memory_allocated"]
        return "ok", "", data

    # ---------------------------------------------------------------------------------------- #
    # Stage 7: multi-rank on one GPU
    # ---------------------------------------------------------------------------------------- #
    def stage_multirank(self):
        steps = 6 if self.rehearsal else 10
        data = {"model": TINY, "seq_len": 64, "steps": steps, "precision": "fp32", "limits": MULTIRANK_LIMITS,
                "global_batch": 4, "mpirun": self.mpirun,
                "untested": [
                    "NCCL with more than one rank: one GPU, and NCCL refuses two ranks on the same device",
                    "CUDA-aware MPI: Debian's OpenMPI is not built with CUDA; the MPI backend on CUDA is only as "
                    "good as shardlm's staging of device tensors through host memory",
                    "more than 2 ranks, more than one GPU, more than one node",
                    "ZeRO stages 1-2 with 2 ranks on CUDA (stage 3 is run below)",
                ]}
        if not self.mpirun:
            return "skipped", "no mpirun on PATH (deps stage)", data
        keys1 = {"device": self.dev, "comm.backend": "mpi", "attn_implementation": "eager"}
        ref = self.train("multirank_1rank", base_config(TINY, 4, 64, steps), keys1, 40)
        two = self.train("multirank_2rank_mpi", base_config(TINY, 2, 64, steps), keys1, 60, nproc=2)
        data["runs"] = [ref.brief(), two.brief()]
        failures = []

        def against_one_rank(run):
            """The run against the 1-rank reference, within MULTIRANK_LIMITS."""
            if not (ref.ok and run.ok):
                return {"pass": False, "error": run.brief().get("error")}
            return judged(ref, run, MULTIRANK_LIMITS)

        data["mpi_2_ranks"] = against_one_rank(two)
        if not (ref.ok and two.ok):
            for label, r_ in (("1 rank", ref), ("2 ranks", two)):
                if not r_.ok:
                    failures.append(f"{label}: {r_.brief().get('error')}")
        if self.remaining() > 20:
            z3 = self.train("multirank_2rank_mpi_zero3", base_config(TINY, 2, 64, steps, stage=3), keys1, 60, nproc=2)
            data["runs"].append(z3.brief())
            data["mpi_2_ranks_zero3"] = against_one_rank(z3)
        # Tensor parallelism on the device (2 ranks sharing the GPU through the MPI backend; dp=1, so
        # the micro-batch is the 1-rank reference's): the vocab-parallel loss and the f/g collectives
        # on CUDA tensors.
        if "parallelism.tensor_parallel" in self.supported and self.remaining() > 20:
            tp = self.train("multirank_2rank_mpi_tp2", base_config(TINY, 4, 64, steps),
                            dict(keys1, **{"parallelism.tensor_parallel": 2}), 60, nproc=2)
            data["runs"].append(tp.brief())
            data["mpi_2_ranks_tp2"] = against_one_rank(tp)
        if "comm.backend" not in self.supported:
            data["nccl_2_ranks"] = {"status": "skipped", "reason": "this shardlm has no comm.backend key"}
        elif self.remaining() > 10:
            nccl_timeout = 60
            n = self.train("multirank_2rank_nccl", base_config(TINY, 2, 64, 2),
                           {"device": self.dev, "comm.backend": "nccl"}, nccl_timeout, nproc=2)
            msgs = [ln.strip() for ln in n.res.output.splitlines()
                    if re.search(r"error|nccl|NCCL|duplicate|same (GPU|device)", ln, re.I)]
            data["nccl_2_ranks"] = {
                "exit": n.res.rc, "seconds": round(n.res.seconds, 1), "timed_out": n.res.timed_out,
                "failed_fast": n.res.rc != 0 and not n.res.timed_out and n.res.seconds < nccl_timeout,
                "message": msgs[:6] or n.res.tail(6).splitlines(),
                "note": "expected: refused at start (NCCL cannot put two ranks on one GPU)"}
            data["runs"].append(n.brief())
        ok = not failures
        data["pass"] = ok and data["mpi_2_ranks"].get("pass", False)
        if failures:
            return "failed", join_failures(failures), data
        return "ok", "" if data["pass"] else "2 ranks differ from 1 rank beyond the limits", data

    # ---------------------------------------------------------------------------------------- #
    # Stage 8: mixtures of experts, CPU against CUDA
    # ---------------------------------------------------------------------------------------- #
    def stage_moe(self):
        """Tiny Mixtral and Qwen2-MoE, CPU against CUDA in fp32 and bf16, within the dense parity
        limits; and ZeRO-3 on one rank against stage 0 in fp32 (the fused expert tensors as flat units)."""
        steps = 6 if self.rehearsal else 12
        data = {"models": TINY_MOE, "micro_batch": 4, "seq_len": 64, "steps": steps, "limits": PARITY_LIMITS,
                "runs": [], "comparisons": {}}
        passes, failures = [], []
        for fam, model in TINY_MOE.items():
            for prec in ("fp32", "bf16"):
                if self.remaining() < 10:
                    failures.append("stage time cap reached")
                    break
                cfg = base_config(model, 4, 64, steps, bf16=(prec == "bf16"))
                ref = self.train(f"moe_{fam}_{prec}_cpu", cfg, {"device": "cpu", "attn_implementation": "eager"}, 40)
                dcfg = dict(cfg, threads=1) if self.rehearsal else cfg
                dev = self.train(f"moe_{fam}_{prec}_{self.dev}", dcfg,
                                 {"device": self.dev, "attn_implementation": "eager"}, 40)
                data["runs"] += [ref.brief(), dev.brief()]
                if not (ref.ok and dev.ok):
                    failures.append(f"{fam} {prec}: {(dev if ref.ok else ref).brief().get('error')}")
                    continue
                c = judged(ref, dev, PARITY_LIMITS[prec])
                data["comparisons"][f"{fam}_{prec}"] = c
                passes.append(c["pass"])
                print(f"[gpu_check] moe {fam} {prec} cpu vs {self.dev}: loss step1 {c['loss_step1_rel']:.2e} "
                      f"max {c['loss_max_rel']:.2e} -> {'pass' if c['pass'] else 'FAIL ' + str(c['limits_exceeded'])}",
                      flush=True)
        if self.remaining() > 15:
            # fp32: in bf16 one rounding placed elsewhere can flip a token's top-k choice, and with it
            # the expert that token trains, which no tolerance on the weights describes.
            model = TINY_MOE["mixtral"]
            s0 = self.train("moe_zero0_fp32", base_config(model, 4, 64, steps, stage=0), {"device": self.dev}, 40)
            s3 = self.train("moe_zero3_fp32", base_config(model, 4, 64, steps, stage=3), {"device": self.dev}, 40)
            data["runs"] += [s0.brief(), s3.brief()]
            if s0.ok and s3.ok:
                c = judged(s0, s3, PARITY_LIMITS["fp32"])
                data["comparisons"]["mixtral_zero3_vs_zero0_fp32"] = c
                passes.append(c["pass"])
            else:
                failures.append(f"zero: {(s3 if s0.ok else s0).brief().get('error')}")
        data["pass"] = bool(passes) and all(passes) and not failures
        if failures:
            return "failed", join_failures(failures), data
        return "ok", "" if data["pass"] else "ran; some differences exceed the limits (see comparisons)", data

    def offload_variant(self, data, runs, name, ref, limits, vs_key, held_key, base_time, held):
        """Offload run `name` judged against run `ref` within `limits` (data[vs_key], with whether the losses
        are bitwise equal), `held(memory)` saying its bytes are where they belong (data[held_key]) and its
        step time over `base_time`; True when it passed, or did not run (time ran out; a run that failed
        has already failed the stage)."""
        if name not in runs:
            return True
        c = judged(runs[ref], runs[name], limits)
        c["bitwise_equal_losses"] = runs[ref].losses() == runs[name].losses()
        data[vs_key] = c
        detail = data["runs_detail"][name]
        mem = detail["memory"]
        data[held_key] = held(mem)
        t = detail["step_time_s_median"]
        data[f"{name}_step_time_ratio"] = round(t / base_time, 4) if base_time and t else None
        print(f"[gpu_check] offload {name} vs {ref} on {self.dev}: losses bitwise equal {c['bitwise_equal_losses']}, "
              f"loss max {c['loss_max_rel']:.2e}; step {t} s; device params {fmt_bytes(mem.get('compute_params'))}, "
              f"host {fmt_bytes(mem.get('host'))}, disk {fmt_bytes(mem.get('offloaded'))}; {held_key} "
              f"{data[held_key]}", flush=True)
        return c["pass"] and data[held_key]

    # ---------------------------------------------------------------------------------------- #
    # Stage 9: ZeRO-Offload (offload_optimizer cpu) on CUDA against the same run without it
    # ---------------------------------------------------------------------------------------- #
    def stage_offload(self):
        """ZeRO stage 2, bf16, one rank: the fp32 masters and Adam moments in pinned host memory, the
        step on the CPU, against the same CUDA run without offload (OFFLOAD_LIMITS); then with them in
        files under the work directory (offload_optimizer nvme, streamed through the host); step times
        and the host / device / disk bytes (memory.json, which must equal plan.json key by key); ZeRO-3
        with the parameter shards in pinned host memory too (offload_param cpu), against the same run;
        ZeRO-Infinity (ZeRO-3, parameters and states both in files: offload_param and offload_optimizer nvme);
        and bf16 masters through the host optimizer, alone and with offload_param cpu (the host shards are
        the masters)."""
        if self.rehearsal:  # the GPU layout on the CPU (train/config_options.h host_optimizer_apart)
            model, B, T, steps, env = TINY, 4, 64, 5, {"SHARDLM_TEST_OFFLOAD_APART": "1"}
        else:
            model, B, T, steps, env = {"preset": "demo"}, 8, 128, 10, None
        data = {"model": model, "micro_batch": B, "seq_len": T, "steps": steps, "precision": "bf16", "zero_stage": 2,
                "limits": OFFLOAD_LIMITS, "runs": [], "runs_detail": {}}
        cfg = base_config(model, B, T, steps, bf16=True, stage=2, log_interval=1)
        offload = {"zero_optimization.offload_optimizer.device": "cpu"}
        # Parameter offload too (zero_engine.h offload_param_apart): ZeRO stage 3, the shards in pinned host
        # memory copied up into the gather buffers; judged against the same stage-2 run without offload.
        params = dict(offload, **{"zero_optimization.offload_param.device": "cpu", "zero_optimization.stage": 3,
                                 "zero_optimization.stage3_param_persistence_threshold": 0})
        nvme_dir = self.work / "offload_nvme_states"
        nvme_dir.mkdir(parents=True, exist_ok=True)
        nvme = {"zero_optimization.offload_optimizer.device": "nvme",
                "zero_optimization.offload_optimizer.nvme_path": str(nvme_dir)}
        # bf16 masters (Kahan) on the GPU run through the host optimizer: bf16 host masters and compensation.
        bf16_masters = dict(offload, **{"optimizer.master_precision": "bf16", "optimizer.master_rounding": "kahan"})
        # With parameter offload too (ZeRO-3): the host parameter shards are the host optimizer's bf16 masters.
        bf16_params = dict(bf16_masters, **{k: v for k, v in params.items() if k not in offload})
        # Canonical ZeRO-Infinity: parameters and optimizer states both on NVMe (ZeRO stage 3, every sharded
        # unit's shard in a file: max_in_cpu 0); the paged masters are cast straight into the host shards.
        infinity = dict(nvme, **{"zero_optimization.offload_param.device": "nvme",
                                 "zero_optimization.offload_param.nvme_path": str(nvme_dir),
                                 "zero_optimization.offload_param.max_in_cpu": 0, "zero_optimization.stage": 3,
                                 "zero_optimization.stage3_param_persistence_threshold": 0})
        self.supported.update(params)  # keys the probe does not ask about: refused loudly if unknown
        self.supported.update(infinity)
        self.supported.update(bf16_masters)
        self.supported.update(bf16_params)
        runs = {}
        for name, keys, e in (("none", {}, None), ("offload", offload, env), ("param_offload", params, env),
                              ("nvme", nvme, env), ("infinity", infinity, env), ("bf16_masters", bf16_masters, env),
                              ("bf16_param_masters", bf16_params, env)):
            r = self.train(f"offload_{name}", cfg, dict(keys, device=self.dev), 60, env=e)
            runs[name] = r
            data["runs"].append(r.brief())
            mem = r.memory or {}
            times = [x["step_time_s"] for x in r.metrics if x.get("step", 0) > 2 and x.get("step_time_s")]
            plan = (r.plan or {}).get("stages") or [{}]
            keys_ = ("compute_params", "gradients", "master_params", "optimizer_states", "host", "offloaded",
                     "total_model_states")
            data["runs_detail"][name] = {
                "step_time_s_median": median(times), "step_times_s": [x.get("step_time_s") for x in r.metrics],
                "memory": {k: mem.get(k) for k in keys_ + ("device_peak_allocated", "device_reserved_after_init")},
                "memory_equals_plan": bool(mem) and all(mem.get(k) == plan[0].get(k) for k in keys_),
                "log_line": next((ln for ln in r.res.output.splitlines()
                                  if "optimizer step on the host" in ln or "on NVMe at" in ln), None)}
            if self.remaining() < 8:
                break
        failures = [f"{n}: {r.brief().get('error')}" for n, r in runs.items() if not r.ok]
        if len(runs) < 3:
            failures.append("offload run not started (time)")
        if failures:
            data["pass"] = False
            return "failed", join_failures(failures), data
        c = judged(runs["none"], runs["offload"], OFFLOAD_LIMITS)
        c["bitwise_equal_losses"] = runs["none"].losses() == runs["offload"].losses()
        data["vs_no_offload"] = c
        cp = judged(runs["none"], runs["param_offload"], OFFLOAD_LIMITS)
        cp["bitwise_equal_losses"] = runs["none"].losses() == runs["param_offload"].losses()
        data["param_offload_vs_no_offload"] = cp
        t0, t1 = (data["runs_detail"][n]["step_time_s_median"] for n in ("none", "offload"))
        data["step_time_ratio"] = round(t1 / t0, 4) if t0 and t1 else None
        m = data["runs_detail"]["offload"]["memory"]
        moved = (m.get("host") or 0) > 0 and m.get("master_params") == 0 and m.get("optimizer_states") == 0
        data["states_on_host"] = moved
        # The runs after these three, each judged against its reference where it ran (time may have run out).
        # NVMe: only the staging on the host, the masters and moments on disk.
        nvme_ok = self.offload_variant(
            data, runs, "nvme", "none", OFFLOAD_LIMITS, "nvme_vs_no_offload", "nvme_states_on_disk", t0,
            lambda mn: (mn.get("offloaded") or 0) > (mn.get("host") or 0) > 0 and mn.get("master_params") == 0 and
            mn.get("optimizer_states") == 0)
        # bf16 masters through the host optimizer: near the fp32-master run, no master on the device, and a
        # smaller host line than fp32 masters' (2 + 2 bytes of master and compensation per element against
        # 4 + 2 of master and cast buffer).
        bf16_ok = self.offload_variant(
            data, runs, "bf16_masters", "offload", BF16_MASTER_LIMITS, "bf16_masters_vs_fp32_masters",
            "bf16_masters_on_host", t1,
            lambda mb: mb.get("master_params") == 0 and mb.get("optimizer_states") == 0 and
            0 < (mb.get("host") or 0) < (m.get("host") or 0))
        # bf16 masters with parameter offload: near the ZeRO-2 bf16-master run (same master format, stage 3
        # reductions), no parameter or master on the device, and a host line exactly that run's: the host
        # shards are the masters, held once.
        mb2 = (data["runs_detail"].get("bf16_masters") or {}).get("memory") or {}
        bf16_params_ok = self.offload_variant(
            data, runs, "bf16_param_masters", "bf16_masters", OFFLOAD_LIMITS, "bf16_param_masters_vs_bf16_masters",
            "bf16_param_masters_held_once", t1,
            lambda mp: mp.get("compute_params") == 0 and mp.get("master_params") == 0 and
            mp.get("optimizer_states") == 0 and 0 < (mp.get("host") or 0) == (mb2.get("host") or -1))
        # ZeRO-Infinity: no parameter, master or moment left on the device; the host holds only the gradient
        # copies (no shard is in memory between steps, no staging buffer); the disk holds all of them.
        infinity_ok = self.offload_variant(
            data, runs, "infinity", "none", OFFLOAD_LIMITS, "infinity_vs_no_offload", "infinity_on_disk", t0,
            lambda mi: mi.get("compute_params") == 0 and mi.get("master_params") == 0 and
            mi.get("optimizer_states") == 0 and (mi.get("offloaded") or 0) > (mi.get("host") or 0) > 0)
        planned = all(d["memory_equals_plan"] for d in data["runs_detail"].values())
        pm = data["runs_detail"]["param_offload"]["memory"]
        # Every unit sharded (threshold 0): no parameter bytes left on the device. (The host line holds the
        # shards instead of the bf16 staging buffers they replace: as large as the stage-2 offload's.)
        data["param_shards_on_host"] = pm.get("compute_params") == 0 and (pm.get("host") or 0) >= (m.get("host") or 0)
        data["pass"] = c["pass"] and cp["pass"] and moved and planned and data["param_shards_on_host"] and nvme_ok and \
            bf16_ok and infinity_ok and bf16_params_ok
        print(f"[gpu_check] offload cpu vs none on {self.dev}: losses bitwise equal {c['bitwise_equal_losses']}, "
              f"loss max {c['loss_max_rel']:.2e}, weights {c.get('weights_max_normwise_rel', float('nan')):.2e}; "
              f"step {t1} s vs {t0} s; host {fmt_bytes(m.get('host'))}, memory = plan {planned}; param offload "
              f"losses bitwise equal {cp['bitwise_equal_losses']}, loss max {cp['loss_max_rel']:.2e}, shards on "
              f"host {data['param_shards_on_host']} -> "
              f"{'pass' if data['pass'] else 'FAIL'}", flush=True)
        if data["pass"]:
            return "ok", "", data
        return "ok", "ran; " + ("losses/weights beyond the limits " if not (c["pass"] and cp["pass"]) else "") + \
            ("parameter shards not moved to the host " if not data["param_shards_on_host"] else "") + \
            ("states not moved to the host " if not moved else "") + ("nvme run failed or off " if not nvme_ok else "") + \
            ("bf16-master run failed or off " if not bf16_ok else "") + \
            ("bf16-master parameter-offload run failed or off " if not bf16_params_ok else "") + \
            ("infinity run failed or off " if not infinity_ok else "") + \
            ("memory.json != plan.json" if not planned else ""), data

    def stages(self):
        signal.signal(signal.SIGTERM, on_sigterm)
        if self.bin is not None:
            self.probe()
            write_json(self.work / "probe.json", self.probe_notes)
        else:
            self.llama_1b_preset = True
        fns = {"parity": self.stage_parity, "zero": self.stage_zero, "speed": self.stage_speed,
               "peer": self.stage_peer, "multirank": self.stage_multirank, "moe": self.stage_moe,
               "offload": self.stage_offload}
        only = [s for s in (self.args.only or "").split(",") if s]
        for name in RUN_ORDER:
            if only and name not in only:
                if not stage_file(self.work, name).exists():
                    record(self.work, self.out, name, "skipped", "not selected (GPU_CHECK_ONLY / --only)")
                continue
            self.run_stage(name, fns[name])
        # the probe's findings go with the build stage's record
        b = read_json(stage_file(self.work, "build"))
        if b is not None and self.probe_notes:
            b["binary_features"] = self.probe_notes
            write_json(stage_file(self.work, "build"), b)
        merge(self.work, self.out)


# --------------------------------------------------------------------------------------------- #
# Arithmetic
# --------------------------------------------------------------------------------------------- #
def join_failures(failures):
    """One reason from several: the same error message said once, with what it applies to."""
    by_msg = {}
    for f in failures:
        what, _, msg = f.partition(": ")
        by_msg.setdefault(msg[:300], []).append(what)
    return "; ".join(f"{', '.join(whats)}: {msg}" if msg else ", ".join(whats) for msg, whats in by_msg.items())


def median(xs):
    xs = sorted(x for x in xs if isinstance(x, (int, float)))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def fmt_bytes(b):
    return f"{b / 2**30:.2f} GiB" if isinstance(b, (int, float)) else "?"


def rel(a, b):
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), 1e-30)


def load_weights(path):
    try:
        from safetensors.numpy import load_file
        return {k: v.astype("float64") for k, v in load_file(str(path)).items()}
    except Exception:  # bf16 tensors, or no safetensors package: torch reads anything
        import torch
        from safetensors.torch import load_file
        return {k: v.double().numpy() for k, v in load_file(str(path)).items()}


def compare(a, b):
    """b against the reference a: per-step relative loss / grad-norm differences, final weights."""
    la, lb, ga, gb = a.losses(), b.losses(), a.grad_norms(), b.grad_norms()
    n = min(len(la), len(lb))
    lr_ = [rel(la[i], lb[i]) for i in range(n)]
    gr_ = [rel(ga[i], gb[i]) for i in range(min(len(ga), len(gb), n))]
    c = {"steps_compared": n, "steps_a": len(la), "steps_b": len(lb),
         "loss_step1_rel": lr_[0] if lr_ else None,
         "loss_max_rel": max((x for x in lr_ if x is not None), default=None),
         "loss_last_rel": lr_[-1] if lr_ else None,
         "grad_norm_step1_rel": gr_[0] if gr_ else None,
         "grad_norm_max_rel": max((x for x in gr_ if x is not None), default=None),
         "loss_a": [round(x, 7) for x in la[:n] if x is not None][:3] + ["..."] + [round(la[n - 1], 7)] if n > 3 else la[:n],
         "loss_b": [round(x, 7) for x in lb[:n] if x is not None][:3] + ["..."] + [round(lb[n - 1], 7)] if n > 3 else lb[:n]}
    wa, wb = a.dir / "model.safetensors", b.dir / "model.safetensors"
    if wa.exists() and wb.exists():
        import numpy as np
        A, B = load_weights(wa), load_weights(wb)
        if set(A) != set(B):
            c["weights_error"] = f"different tensor names: {sorted(set(A) ^ set(B))[:5]}"
        else:
            worst, worst_name, max_abs = 0.0, None, 0.0
            for k in A:
                if A[k].shape != B[k].shape:
                    c["weights_error"] = f"{k}: shape {A[k].shape} vs {B[k].shape}"
                    break
                d = A[k] - B[k]
                nw = float(np.linalg.norm(d) / max(np.linalg.norm(A[k]), 1e-30))
                if nw > worst:
                    worst, worst_name = nw, k
                max_abs = max(max_abs, float(np.abs(d).max()) if d.size else 0.0)
            c.update(weights_max_normwise_rel=worst, weights_worst_tensor=worst_name, weights_max_abs=max_abs,
                     weights_tensors=len(A))
    else:
        c["weights_error"] = "model.safetensors missing in " + ", ".join(str(p.parent.name) for p in (wa, wb) if not p.exists())
    return c


def judged(a, b, limits):
    """compare(a, b) with the names of the limits it exceeds (a missing number exceeds its limit) and
    whether it passes."""
    c = compare(a, b)
    c["limits_exceeded"] = [k for k, lim in limits.items() if c.get(k) is None or not (c[k] <= lim)]
    c["pass"] = not c["limits_exceeded"]
    return c


def plan_entry(plan, stage):
    """The planner's per-rank bytes for `stage` from plan.json (an element of "stages")."""
    if not isinstance(plan, dict):
        return None
    stages = plan.get("stages") or []
    pick = next((s for s in stages if s.get("stage") == stage), stages[0] if len(stages) == 1 else None)
    if pick is None:
        return None
    keep = ("stage", "compute_params", "gradients", "master_params", "optimizer_states", "activations",
            "comm_buffers", "gathered_peak", "total_model_states", "total", "fits")
    e = {k: pick.get(k) for k in keep if k in pick}
    e["activation_method"] = plan.get("activation_method")
    e["device_memory"] = plan.get("device_memory")
    return e


def flops_per_token(m, T, parameters=None):
    """Model FLOPs per trained token (forward + backward), the MFU numerator.

    Dense: 6 N per token (2 N forward: one multiply-add per parameter; 4 N backward: gradients of
    inputs and of weights), N = every parameter as shardlm counts it (memory.json "parameters").
    The embedding table does no multiply-adds (a lookup), so "excluding_embedding_lookup" also
    gives 6 (N - V d) for an untied model; a tied table is still the head's matrix.

    Attention (not in N): per layer and sequence, S = Q K^T is T x T x d multiply-adds over all
    heads (d = heads * head_dim; grouped-query attention shares K/V but every query head still
    scores every key), and O = P V another T x T x d: 4 T^2 d FLOPs forward without a mask. Causal
    attention needs only the lower triangle (T(T+1)/2 ~ T^2/2 pairs), which is what a fused kernel
    computes (it skips masked tiles): 2 T^2 d forward. Backward is twice forward (dQ and dK from
    dS, dV and dP): 4 T^2 d. Together 6 T^2 d per layer and sequence = 6 T d per token per layer:
        attention FLOPs per token = 6 L T d      (PaLM's non-causal count is 12 L T d)
    Flash attention's backward recomputes S (hardware FLOPs), which model FLOPs do not count.
    """
    V, d, f = m["vocab_size"], m["hidden_size"], m["intermediate_size"]
    L, H, KV = m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"]
    tied = bool(m.get("tie_word_embeddings", False))
    kv = d // H * KV
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * f + 2 * d  # q, k, v, o, gate/up/down, 2 norms
    n_formula = L * per_layer + V * d * (1 if tied else 2) + d
    N = parameters or n_formula
    dense = 6 * N
    attn = 6 * L * T * d
    return {"parameters": N, "parameters_formula": n_formula, "dense_6N": dense, "attention_6LTd": attn,
            "per_token": dense + attn,
            "per_token_excluding_embedding_lookup": 6 * (N - (0 if tied else V * d)) + attn,
            "formula": "6*N + 6*L*T*d (causal attention, fwd+bwd); N = all parameters"}


# --------------------------------------------------------------------------------------------- #
# Finalize: merged JSON, tarball of the runs' small files, a readable summary in the log
# --------------------------------------------------------------------------------------------- #
def finalize(args):
    runs = Path(args.work) / "runs"
    if runs.exists():
        with tarfile.open(Path(args.out) / "runs.tar.gz", "w:gz") as tar:
            for p in sorted(runs.rglob("*")):
                if p.is_file() and p.suffix != ".safetensors" and p.stat().st_size < 4_000_000:
                    tar.add(p, arcname=str(p.relative_to(runs.parent)))
    doc = merge(args.work, args.out, final=True)
    s = doc["summary"]
    print("\n========== gpu_check summary ==========")
    for name in STAGE_ORDER:
        st = doc["stages"][name]
        print(f"  {name:10s} {st.get('status'):12s} {st.get('seconds', ''):>8} s  {st.get('reason', '')}")
    for k, v in s.items():
        if k not in ("status", "untested"):
            print(f"  {k}: {v}")
    print(f"  untested: {s.get('untested')}")
    print(f"  JSON: {Path(args.out) / 'gpu_check.json'}  elapsed {doc.get('elapsed_s')} s")
    return 0


def main():
    ap = argparse.ArgumentParser(description="scripts/gpu/gpu_check.sh's stages and JSON")
    ap.add_argument("command", choices=("env", "record", "stages", "finalize"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rehearsal", action="store_true")
    ap.add_argument("--stage")
    ap.add_argument("--status", choices=("ok", "failed", "skipped"))
    ap.add_argument("--reason", default="")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--data", default="{}", help="JSON object of numbers for the record")
    ap.add_argument("--shardlm")
    ap.add_argument("--deadline", type=float, help="epoch seconds by which stages must be done")
    ap.add_argument("--started", type=float)
    ap.add_argument("--budget", type=float)
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(RUN_ORDER))
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.command == "env":
        return stage_env(args)
    if args.command == "record":
        try:
            data = json.loads(args.data)
        except ValueError:
            data = {"data_unparsed": args.data}
        record(args.work, args.out, args.stage, args.status, args.reason, args.seconds, data)
        return 0
    if args.command == "stages":
        if not args.deadline:
            args.deadline = time.time() + 400
        Check(args).stages()
        return 0
    return finalize(args)


if __name__ == "__main__":
    sys.exit(main())
