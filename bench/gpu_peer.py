#!/usr/bin/env python3
"""The plain-PyTorch peer of scripts/gpu/gpu_check.sh's speed stage, and the bf16 GEMM peak it is measured
against. One process, one device, no distributed code:

    python3 bench/gpu_peer.py --train-config RUN/train_config.json --json peer.json          # on the GPU
    python3 bench/gpu_peer.py --device cpu --gemm-n 256 --steps 4 --warmup 1 \\
        --model '{"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2}' --micro-batch 2 --seq-len 64   # here

What it trains: transformers' LlamaForCausalLM built from a LlamaConfig with the shape shardlm
resolved (the "model" section of shardlm's train_config.json, HF field names), attn_implementation
"sdpa" (--attn), parameters in fp32 created directly on the device, forward and loss under
torch.autocast(bfloat16) (--dtype fp32: no autocast), mean cross-entropy of the logits in fp32
against the shifted window (not HF's labels=, which shifts again), global-norm clipping to
gradient_clipping, torch.optim.AdamW(fused=True) with shardlm's lr/betas/eps and weight decay on
>= 2-D tensors only. Data: the llm.c token file of the config, rank 0 of 1 at micro-step m reads
the B*T+1 tokens at m*B*T (shardlm's DataLoader order, bench/common.py's llmc_batches).
Initial weights are transformers' own init (seeded), not shardlm's: speed does not depend on
them, and the step-1 loss of both is ~ln(vocab_size) from a 0.02-std init.

Timed: each optimizer step from before the batch is moved to the device to after the step's
loss and grad norm are read back (.item() synchronises), wall clock, like shardlm's step_time_s.
tokens/s = B*T / step time; the first --warmup steps are dropped. Memory:
torch.cuda.max_memory_allocated / max_memory_reserved over the whole run after the GEMM
measurement (peak statistics are reset once the GEMM buffers are freed), and the allocation after
the model and optimizer exist.

GEMM peak (--gemm-n, default 8192 on CUDA): C = A @ B for n x n x n bf16 operands of
torch.randn, --gemm-warmup products (3), then --gemm-iters products (10) between two CUDA events;
TFLOP/s = 2 n^3 / (elapsed / iters). Measured first, before the model exists.

Prints progress to stderr and writes one JSON object to --json (and stdout).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import llmc_batches  # noqa: E402  (stdlib-only module top level)

REPO = Path(__file__).resolve().parents[1]
HF_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta",
             "tie_word_embeddings", "initializer_range", "bos_token_id", "eos_token_id", "hidden_act")


def log(*a):
    print("[gpu_peer]", *a, file=sys.stderr, flush=True)


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gemm_peak(device, n, warmup, iters, dtype_name):
    """Mean TFLOP/s of `iters` n^3 matrix products (after `warmup`), timed with CUDA events."""
    import torch
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    for _ in range(warmup):
        c = a @ b
    sync(device)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            c = a @ b
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        timer = "cuda events"
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            c = a @ b
        seconds = time.perf_counter() - t0
        timer = "perf_counter"
    del a, b, c
    per = seconds / iters
    return {"n": n, "dtype": dtype_name, "warmup": warmup, "iters": iters, "timer": timer,
            "ms_per_product": per * 1e3, "tflops": 2.0 * n ** 3 / per / 1e12}


def resolve_spec(args):
    spec = {"model": {}, "micro_batch": 8, "seq_len": 2048, "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
            "weight_decay": 0.1, "clip": 1.0, "seed": 1234, "data": str(REPO / "data" / "brown" / "train.bin")}
    if args.train_config:
        tc = json.loads(Path(args.train_config).read_text())
        op = tc["optimizer"]["params"]
        spec.update(model={k: v for k, v in tc["model"].items() if k in HF_FIELDS},
                    micro_batch=tc["train_micro_batch_size_per_gpu"], seq_len=tc["data"]["seq_len"],
                    lr=op["lr"], betas=op["betas"], eps=op["eps"], weight_decay=op["weight_decay"],
                    clip=tc.get("gradient_clipping", 1.0), seed=tc.get("seed", 1234), data=tc["data"]["train"])
        if tc.get("gradient_accumulation_steps", 1) != 1:
            sys.exit("gpu_peer: gradient_accumulation_steps != 1 is not supported")
    if args.model:
        text = Path(args.model).read_text() if os.path.isfile(args.model) else args.model
        spec["model"].update(json.loads(text))
    for key in ("micro_batch", "seq_len", "data"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if not spec["model"]:
        sys.exit("gpu_peer: give --train-config or --model")
    data = Path(spec["data"])
    spec["data"] = str(data if data.is_absolute() else REPO / data)
    return spec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train-config", help="shardlm's resolved train_config.json (model, batch, optimizer, data)")
    ap.add_argument("--model", help="HF config fields as JSON (or a file), on top of --train-config's")
    ap.add_argument("--micro-batch", type=int, dest="micro_batch")
    ap.add_argument("--seq-len", type=int, dest="seq_len")
    ap.add_argument("--data", help="llm.c token file (default: the config's data.train)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="autocast dtype (fp32: none)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa | eager")
    ap.add_argument("--gemm-n", type=int, default=None, help="GEMM size (default 8192 on cuda, 0 = skip elsewhere)")
    ap.add_argument("--gemm-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--gemm-warmup", type=int, default=3)
    ap.add_argument("--gemm-iters", type=int, default=10)
    ap.add_argument("--gemm-only", action="store_true", help="measure the GEMM peak and stop")
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args()

    t_start = time.perf_counter()
    import torch
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("gpu_peer: --device cuda but torch.cuda.is_available() is False")
    # Plain fp32 must stay fp32 (no TF32); bf16 autocast is what is being measured.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"system": "pytorch", "torch": torch.__version__, "device": args.device,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu", "dtype": args.dtype,
           "attn_implementation": args.attn}
    gemm_n = args.gemm_n if args.gemm_n is not None else (8192 if cuda else 0)
    if gemm_n > 0:
        out["gemm"] = gemm_peak(args.device, gemm_n, args.gemm_warmup, args.gemm_iters, args.gemm_dtype)
        log(f"GEMM {gemm_n}^3 {args.gemm_dtype}: {out['gemm']['tflops']:.1f} TFLOP/s "
            f"({out['gemm']['ms_per_product']:.3f} ms per product)")
    if args.gemm_only:
        return emit(out, args)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = resolve_spec(args)
    B, T = spec["micro_batch"], spec["seq_len"]
    out.update(transformers=transformers.__version__, model=spec["model"], micro_batch=B, seq_len=T,
               steps=args.steps, warmup=args.warmup, tokens_per_step=B * T)
    torch.manual_seed(spec["seed"])
    cfg = LlamaConfig(**spec["model"], attn_implementation=args.attn)
    t0 = time.perf_counter()
    with torch.device(args.device):
        model = LlamaForCausalLM(cfg)
    model.train()
    params = list(model.parameters())
    out["parameters"] = sum(p.numel() for p in params)
    out["attn_implementation_used"] = getattr(model.config, "_attn_implementation", None)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": spec["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    hyper = dict(lr=spec["lr"], betas=tuple(spec["betas"]), eps=spec["eps"])
    try:
        opt = torch.optim.AdamW(groups, fused=True, **hyper)
        out["optimizer"] = "AdamW(fused=True)"
    except (RuntimeError, TypeError) as e:  # fused needs a supported device/dtype
        opt = torch.optim.AdamW(groups, foreach=True, **hyper)
        out["optimizer"] = f"AdamW(foreach=True) (fused refused: {e})"
    sync(args.device)
    out["init_s"] = time.perf_counter() - t0
    out["memory_allocated_after_init"] = torch.cuda.memory_allocated() if cuda else 0
    log(f"{out['parameters'] / 1e6:.1f}M parameters, B={B} T={T}, {out['optimizer']}, "
        f"attention {out['attn_implementation_used']}, init {out['init_s']:.1f}s")

    batch = llmc_batches(spec["data"], 0, 1, B, T)
    V = spec["model"]["vocab_size"]
    amp = args.dtype == "bf16"
    dev_type = "cuda" if cuda else "cpu"
    step_times, losses, grad_norms = [], [], []
    for step in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        x, y = batch(step)
        x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, spec["clip"]) if spec["clip"] > 0 else torch.zeros(())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        grad_norms.append(float(gn))
        del logits, loss
        sync(args.device)
        step_times.append(time.perf_counter() - t0)
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == args.steps:
            log(f"step {step + 1}/{args.steps} loss {losses[-1]:.4f} grad_norm {grad_norms[-1]:.3f} "
                f"{step_times[-1] * 1e3:.0f} ms ({B * T / step_times[-1]:.0f} tok/s)")
    measured = step_times[args.warmup:] or step_times
    out.update(losses=losses, grad_norms=grad_norms, step_times_s=step_times,
               measured_steps=len(measured),
               step_time_s_median=statistics.median(measured),
               tokens_per_s_median=B * T / statistics.median(measured),
               tokens_per_s_mean=B * T * len(measured) / sum(measured),
               max_memory_allocated=torch.cuda.max_memory_allocated() if cuda else 0,
               max_memory_reserved=torch.cuda.max_memory_reserved() if cuda else 0,
               finite=all(math.isfinite(v) for v in losses),
               wall_s=time.perf_counter() - t_start)
    log(f"median {out['tokens_per_s_median']:.0f} tok/s over {len(measured)} steps, "
        f"peak allocated {out['max_memory_allocated'] / 2**30:.2f} GiB")
    return emit(out, args)


def emit(out, args):
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
