#!/usr/bin/env python3
"""shardlm's ZeRO stages side by side: speed, memory, communication, and PyTorch's ZeRO-1.

Run with the virtual environment's python (/opt/shardlm/venv, made by scripts/setup.sh; it has
torch), from anywhere:

    /opt/shardlm/venv/bin/python bench/zero_stages.py            # full run, ~11 minutes
    /opt/shardlm/venv/bin/python bench/zero_stages.py --quick    # smoke run, under a minute

Everything is measured in one invocation, on 2 MPI ranks x 1 thread (OPENBLAS_NUM_THREADS=1, as
in bench/ddp_vs_torch.py; the helpers both use are in bench/common.py), on the same model, batch and token
data, and printed as five tables:

  1. step time of ZeRO stages 1/2/3 relative to stage 0 (shardlm's DDP path), fp32,
     zero_optimization.overlap_comm on; stages 2 and 3 with overlap_comm off (ratio vs on); and
     stage 3 with stage3_prefetch_bucket_size = one unit (the default, 5e7 elements, prefetches
     the whole demo model, see part 3's gathered peak).
  2. bf16 (bf16.enabled, fp32 master weights and gradient accumulation) against fp32, stages 1-3.
  3. model-state bytes per rank from memory.json against the ZeRO paper's formula for every stage
     and precision (Psi = parameters, N = ranks), with bf16 gradient accumulation too
     (data_types.grad_accum_dtype=bf16, the paper's 2+2+12 bytes/param setting); and stage 3's
     peak of gathered (non-persistent) parameters.
  4. communication bytes per step per rank by operation, from metrics.jsonl.
  5. shardlm stage 1 against torch.distributed.optim.ZeroRedundancyOptimizer wrapping AdamW under
     DDP (gloo, 2 spawned processes x 1 thread; the peer of bench/ddp_vs_torch.py with
     make_peer_optimizer's zero_redundancy switch), as it comes and with shardlm's malloc policy.

Timed configurations are interleaved: every repeat runs each of them once, in an order rotated by
one per repeat, and the first --warmup steps of every run are dropped. The memory-only runs
(bf16 accumulation; speed is not asked of them) run once, 1 step, before the timed ones; the first
of them doubles as the probe whose train_config.json gives the PyTorch peer its shape and
hyper-parameters. The shardlm binary is copied into the work directory first, so a rebuild of
build/ during the run cannot mix two builds.

This machine has 2 cores and is shared: step times jitter by tens of percent. Every timing is a
median with the per-step min-max and the per-repeat medians next to it; only ratios measured in
the same invocation mean anything.
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
# noqa: E402 below: importing common also puts tests/reference on sys.path.
from common import (Config, add_model_args, add_run_length_args, add_shardlm_arg, clean_env, fresh_dir,  # noqa: E402
                    require_modules,
                    parse_run_length_args, read_metrics, run_checked, run_peer, shardlm_overrides)

NPROC = 2
FULL_DEFAULTS = dict(steps=16, warmup=4, repeats=3, micro_batch=8, seq_len=128, model_set=[])
# Quick: a 2-layer, 192-wide version of the demo model (same vocabulary), so the 17 short runs,
# each paying MPI and torch start-up, fit in a minute.
QUICK_DEFAULTS = dict(steps=3, warmup=1, repeats=1, micro_batch=4, seq_len=64,
                      model_set=["num_hidden_layers=2", "hidden_size=192", "intermediate_size=512"])
MB = 1e6


# --------------------------------------------------------------------------- #
# Runs
# --------------------------------------------------------------------------- #
def run_zero(args, out_dir, steps, overrides, what):
    """`shardlm train` on NPROC ranks x 1 thread with `overrides`; (metrics rows, memory.json)."""
    out_dir = fresh_dir(out_dir)
    cmd = [str(args.binary), "train", "--config", str(args.config), "--nproc", str(NPROC),
           f"--steps={steps}", f"--out_dir={out_dir}", "--threads=1", "--resume=false",
           f"--log_interval={max(steps, 1)}", *shardlm_overrides(args), *overrides]
    run_checked(cmd, clean_env(1), f"shardlm {what}")
    memory = json.loads((out_dir / "memory.json").read_text())
    return read_metrics(out_dir / "metrics.jsonl"), memory


def zero_overrides(stage, bf16=False, overlap=True, grad_accum="fp32", prefetch=None):
    o = [f"--zero_optimization.stage={stage}"]
    if stage > 0:
        o.append(f"--zero_optimization.overlap_comm={'true' if overlap else 'false'}")
    if bf16:
        o.append("--bf16.enabled=true")
    o.append(f"--data_types.grad_accum_dtype={grad_accum}")
    if prefetch is not None:
        o.append(f"--zero_optimization.stage3_prefetch_bucket_size={prefetch}")
    return o


class Run(Config):
    """A common.Config that also keeps what it describes (stage, precision) and the
    memory.json of its first run."""

    def __init__(self, key, label, run, stage=None, bf16=False, grad_accum="fp32", memory_only=False):
        super().__init__(key, label, run)
        self.stage, self.bf16, self.grad_accum, self.memory_only = stage, bf16, grad_accum, memory_only
        self.memory = None

    def median_of(self, warmup, key):
        vals = [r[key] for rows in self.measured(warmup) for r in rows if key in r]
        return statistics.median(vals) if vals else None


def unit_numels(train_config):
    """Elements of each ZeRO unit (embedding; each decoder layer; final norm + head), from the
    parameter shapes of tests/reference/hf_llama.py grouped as shardlm's Llama::units() does."""
    import hf_llama

    fields = {k: v for k, v in train_config["model"].items()
              if k not in ("initializer_range", "bos_token_id", "eos_token_id")}
    units = {}
    for name, shape in hf_llama.param_shapes(hf_llama.LlamaConfig.from_dict(fields)).items():
        if name.startswith("model.embed_tokens"):
            key = "embed"
        elif name.startswith("model.layers."):
            key = "layer" + name.split(".")[2]
        else:
            key = "head"
        units[key] = units.get(key, 0) + math.prod(shape)
    return units


def run_retrying(config, out_dir):
    """config.run(out_dir), once more if it fails: on this shared machine a run is sometimes killed
    from outside (signal 9). A second failure ends the benchmark with run_checked's message."""
    try:
        return config.run(out_dir)
    except SystemExit as e:
        print(f"{config.label}: run failed, retrying once:\n{e}", file=sys.stderr)
        return config.run(out_dir)


# --------------------------------------------------------------------------- #
# Tables
# --------------------------------------------------------------------------- #
def fmt_tok(st):
    return f"{st['median']:>8.0f} {st['min']:>7.0f}-{st['max']:<7.0f} {st['step_s']:>7.3f} " \
           f"{', '.join(f'{m:.0f}' for m in st['repeat_medians']):>17}"


TOK_HEAD = f"{'tok/s':>8} {'min-max/step':>15} {'step s':>7} {'repeat medians':>17}"


def wait_ms(run, warmup, op):
    v = run.median_of(warmup, f"comm_{op}_wait_s")
    return "-" if v is None else f"{v * 1e3:.0f}"


def part1(R, S, args):
    print("\n== 1. step time of ZeRO stages vs stage 0 (fp32, 2 ranks x 1 thread) ==")
    head = (f"{'config':<34} {TOK_HEAD} {'vs stage 0':>10} {'vs ref':>7} {'ref':<14} "
            f"{'wait ms AR/RS/AG':>17}")
    print(head)
    print("-" * len(head))
    rows = [("s0", None, ""), ("s1", None, ""), ("s2", None, ""), ("s3", None, ""),
            ("s2_nooverlap", "s2", "overlap on"), ("s3_nooverlap", "s3", "overlap on"),
            ("s3_prefetch1", "s3", "default prefetch")]
    for key, ref, ref_label in rows:
        st = S[key]
        vs_ref = f"{st['median'] / S[ref]['median']:>6.2f}x" if ref else f"{'':>7}"
        waits = "/".join(wait_ms(R[key], args.warmup, op) for op in ("all_reduce", "reduce_scatter", "all_gather"))
        print(f"{R[key].label:<34} {fmt_tok(st)} {st['median'] / S['s0']['median']:>9.2f}x {vs_ref} "
              f"{ref_label:<14} {waits:>17}")
    print("-" * len(head))
    print("vs stage 0, vs ref: tokens/s ratios (> 1: faster). wait ms: median per step of the time rank 0 spent")
    print("blocked in all_reduce / reduce_scatter / all_gather waits (communication not hidden behind compute).")


def part2(R, S, args):
    print("\n== 2. bf16 vs fp32 (bf16 compute, fp32 master weights and gradient accumulation) ==")
    head = f"{'config':<34} {TOK_HEAD} {'bf16 vs fp32':>12} {'step-1 loss':>11}"
    print(head)
    print("-" * len(head))
    for s in (1, 2, 3):
        for key in (f"s{s}", f"s{s}_bf16"):
            ratio = f"{S[key]['median'] / S[f's{s}']['median']:>11.2f}x" if key.endswith("bf16") else f"{'':>12}"
            print(f"{R[key].label:<34} {fmt_tok(S[key])} {ratio} {R[key].step1_loss():>11.4f}")
    print("-" * len(head))


FORMULAS = {  # (stage, compute dtype, grad_accum dtype) -> (text, bytes per rank as f(psi, n))
    (0, "fp32", "fp32"): ("16Ψ", lambda p, n: 16 * p),
    (1, "fp32", "fp32"): ("4Ψ+4Ψ+8Ψ/N", lambda p, n: 4 * p + 4 * p + 8 * p / n),
    (2, "fp32", "fp32"): ("4Ψ+4Ψ/N+8Ψ/N", lambda p, n: 4 * p + 4 * p / n + 8 * p / n),
    (3, "fp32", "fp32"): ("4Ψ/N+4Ψ/N+8Ψ/N", lambda p, n: 4 * p / n + 4 * p / n + 8 * p / n),
    (1, "bf16", "fp32"): ("2Ψ+2Ψ+12Ψ/N", lambda p, n: 2 * p + 2 * p + 12 * p / n),
    (2, "bf16", "fp32"): ("2Ψ+4Ψ/N+12Ψ/N", lambda p, n: 2 * p + 4 * p / n + 12 * p / n),
    (3, "bf16", "fp32"): ("2Ψ/N+4Ψ/N+12Ψ/N", lambda p, n: 2 * p / n + 4 * p / n + 12 * p / n),
    (1, "bf16", "bf16"): ("4Ψ+12Ψ/N", lambda p, n: 4 * p + 12 * p / n),
    (2, "bf16", "bf16"): ("2Ψ+14Ψ/N", lambda p, n: 2 * p + 14 * p / n),
    (3, "bf16", "bf16"): ("16Ψ/N", lambda p, n: 16 * p / n),
}


def part3(runs, args):
    print("\n== 3. model-state bytes per rank (memory.json) vs the ZeRO formula ==")
    any_mem = next(r.memory for r in runs if r.memory)
    psi, n = any_mem["parameters"], any_mem["dp_size"]
    print(f"Ψ = {psi} parameters, N = {n} ranks; MB = 1e6 bytes; formula terms: parameters + gradients + "
          f"optimizer (fp32 master + Adam moments)")
    head = (f"{'config':<34} {'params':>7} {'grads':>7} {'master':>7} {'optim':>7} {'measured':>9} "
            f"{'formula':<17} {'formula MB':>10} {'diff bytes':>10} {'pad elem':>8} {'B/param':>8}")
    print(head)
    print("-" * len(head))
    for r in runs:
        if r.memory is None or r.key in ("s2_nooverlap", "s3_nooverlap", "s3_prefetch1"):
            continue  # same states as the overlap-on / default-prefetch row
        m = r.memory
        text, f = FORMULAS[(r.stage, "bf16" if r.bf16 else "fp32", r.grad_accum if r.bf16 else "fp32")]
        expect = f(psi, n)
        meas = m["total_model_states"]
        print(f"{r.label:<34} {m['compute_params'] / MB:>7.2f} {m['gradients'] / MB:>7.2f} "
              f"{m['master_params'] / MB:>7.2f} {m['optimizer_states'] / MB:>7.2f} {meas / MB:>9.2f} "
              f"{text:<17} {expect / MB:>10.2f} {meas - expect:>+10.0f} {m.get('padding_elements', 0):>8} "
              f"{meas / psi:>8.2f}")
    print("-" * len(head))
    print("diff = measured - formula: the padding of each unit to a multiple of N (pad elem, counted once; it")
    print("appears in every state category), plus anything the formula does not model.")
    print("stage 3 peak of gathered (non-persistent) parameters, bytes per rank, on top of the states above:")
    for key in ("s3", "s3_prefetch1", "s3_bf16", "s3_bf16acc"):
        r = next((x for x in runs if x.key == key), None)
        if r is None or r.memory is None:
            continue
        full = psi * (2 if r.bf16 else 4)
        g = r.memory["gathered_peak"]
        print(f"  {r.label:<34} {g / MB:>7.2f} MB = {g / full:.2f} x the full model in its compute dtype "
              f"({full / MB:.2f} MB)")


COMM_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def volume(op, nbytes, n):
    """Bytes of the full tensor an operation moves through each rank, the ZeRO paper's measure (a
    ring sends (N-1)/N of it): all_reduce = 2x its buffer, reduce_scatter = its full input,
    all_gather = its full output = N x the shard each rank contributes (what shardlm counts)."""
    return {"all_reduce": 2 * nbytes, "reduce_scatter": nbytes, "all_gather": n * nbytes,
            "broadcast": nbytes}.get(op, nbytes)


def part4(runs, R, args):
    print("\n== 4. communication per step per rank, by operation (metrics.jsonl comm_<op>_bytes) ==")
    psi = next(r.memory for r in runs if r.memory)["parameters"]
    head = (f"{'config':<34} " + " ".join(f"{op:>14}" for op in COMM_OPS[:3])
            + f" {'volume MB':>10} {'volume B/param':>14} {'vs stage 0':>10} {'ring-sent MB':>12}")
    print(head)
    print("-" * len(head))
    vol0 = None
    for key in ("s0", "s1", "s2", "s3", "s1_bf16", "s2_bf16", "s3_bf16"):
        r = R[key]
        per_op = {op: r.median_of(args.warmup, f"comm_{op}_bytes") or 0.0 for op in COMM_OPS}
        vol = sum(volume(op, b, NPROC) for op, b in per_op.items())
        vol0 = vol if key == "s0" else vol0
        cells = " ".join(f"{per_op[op] / MB:>11.2f} MB" for op in COMM_OPS[:3])
        print(f"{r.label:<34} {cells} {vol / MB:>10.2f} {vol / psi:>14.2f} {vol / vol0:>9.2f}x "
              f"{vol * (NPROC - 1) / NPROC / MB:>12.2f}")
    print("-" * len(head))
    print("per-op columns: bytes each rank hands to the operation per step (all_reduce: the buffer; reduce_scatter:")
    print("the full input; all_gather: the rank's shard), as shardlm counts them. volume: the ZeRO paper's measure,")
    print("all_reduce 2x buffer, reduce_scatter 1x input, all_gather N x shard; ring-sent = volume x (N-1)/N, what a")
    print("ring algorithm actually sends per rank. The tiny all_reduce of stages 1-3 is the loss and the grad norm.")


def part5(R, S, args, vocab_size):
    print("\n== 5. shardlm ZeRO stage 1 vs PyTorch ZeroRedundancyOptimizer(AdamW) under DDP (fp32, gloo) ==")
    head = f"{'config':<34} {TOK_HEAD} {'vs torch ZeRO':>13} {'vs torch ZeRO+malloc':>20} {'step-1 loss':>11}"
    print(head)
    print("-" * len(head))
    for key in ("s1", "torch_zero", "torch_zero_malloc"):
        st = S[key]
        print(f"{R[key].label:<34} {fmt_tok(st)} {st['median'] / S['torch_zero']['median']:>12.2f}x "
              f"{st['median'] / S['torch_zero_malloc']['median']:>19.2f}x {R[key].step1_loss():>11.4f}")
    print("-" * len(head))
    print(f"like for like: shardlm stage 1 vs torch ZeRO+malloc (same allocator policy). ln V = {math.log(vocab_size):.4f}:")
    print("with the 0.02-std init every step-1 loss should be close to it.")


def sanity(runs, args):
    """fp32 stages train the same problem: same step-1 loss, close last-step losses."""
    fp32 = [r for r in runs if not r.memory_only and r.stage is not None and not r.bf16]
    s1 = [r.step1_loss() for r in fp32]
    last = [r.repeats[0][-1]["loss"] for r in fp32]
    bf = [r.step1_loss() for r in runs if r.bf16 and not r.memory_only]
    print(f"\nsanity: fp32 shardlm runs, step-1 loss spread {max(s1) - min(s1):.2e}, step-{args.steps} loss spread "
          f"{max(last) - min(last):.2e} (all stages train the same problem); bf16 step-1 loss minus fp32: "
          f"{max(abs(b - s1[0]) for b in bf):.2e} at most")


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)
    add_shardlm_arg(p)
    add_model_args(p)
    p.add_argument("--work-dir", type=Path, help="keep every run's metrics.jsonl and memory.json here "
                                                 "(default: a temporary directory, deleted)")
    return parse_run_length_args(p, FULL_DEFAULTS, QUICK_DEFAULTS)


def main():
    args = parse_args()
    require_modules("torch")
    if not args.shardlm.exists():
        sys.exit(f"{args.shardlm} not found: build it first (cmake --build build -j2) or pass --shardlm PATH")

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="zero_stages."))
    work.mkdir(parents=True, exist_ok=True)
    args.binary = work / "shardlm"
    shutil.copy2(args.shardlm, args.binary)
    t_start = time.time()
    load = os.getloadavg()[0]
    print(f"load average before start: {load:.2f}"
          + ("  (other work is running: expect noisy numbers)" if load > 0.5 else ""), file=sys.stderr)

    # Memory-only runs, 1 step each: bf16 gradient accumulation. The first is also the probe.
    mem_only = [Run(f"s{s}_bf16acc", f"stage {s}, bf16, bf16 grad accum", None, stage=s, bf16=True,
                    grad_accum="bf16", memory_only=True) for s in (1, 2, 3)]
    for r in mem_only:
        rows, r.memory = run_zero(args, work / r.key, 1, zero_overrides(r.stage, bf16=True, grad_accum="bf16"), r.label)
        r.repeats.append(rows)
    train_config = json.loads((work / mem_only[0].key / "train_config.json").read_text())
    units = unit_numels(train_config)
    one_unit = max(units.values())

    def zero(key, label, stage, bf16=False, **kw):
        def run(d):
            rows, mem = run_zero(args, d, args.steps, zero_overrides(stage, bf16=bf16, **kw), label)
            if r.memory is None:
                r.memory = mem
            return rows
        r = Run(key, label, run, stage=stage, bf16=bf16)
        return r

    timed = [
        zero("s0", "stage 0 (DDP), fp32", 0),
        zero("s1", "stage 1, fp32", 1),
        zero("s2", "stage 2, fp32", 2),
        zero("s3", "stage 3, fp32", 3),
        zero("s2_nooverlap", "stage 2, fp32, overlap_comm off", 2, overlap=False),
        zero("s3_nooverlap", "stage 3, fp32, overlap_comm off", 3, overlap=False),
        zero("s3_prefetch1", f"stage 3, fp32, prefetch {one_unit / 1e6:.2f}M", 3, prefetch=one_unit),
        zero("s1_bf16", "stage 1, bf16", 1, bf16=True),
        zero("s2_bf16", "stage 2, bf16", 2, bf16=True),
        zero("s3_bf16", "stage 3, bf16", 3, bf16=True),
        Run("torch_zero", "torch ZeRO-1 (as it comes)",
            lambda d: run_peer(args, train_config, NPROC, False, d, {"zero_redundancy": True})),
        Run("torch_zero_malloc", "torch ZeRO-1 (+malloc env)",
            lambda d: run_peer(args, train_config, NPROC, True, d, {"zero_redundancy": True})),
    ]
    total = len(timed) * args.repeats
    done = 0
    for rep in range(args.repeats):
        order = timed[rep % len(timed):] + timed[:rep % len(timed)]  # rotate: interleave
        for c in order:
            done += 1
            t0 = time.time()
            c.repeats.append(run_retrying(c, work / f"{c.key}.{rep}"))
            med = statistics.median(r["tokens_per_s"] for r in c.repeats[-1] if r["step"] > args.warmup)
            print(f"[{done}/{total}] {c.label:<34} repeat {rep + 1}: median {med:.0f} tok/s "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)

    R = {r.key: r for r in timed + mem_only}
    S = {r.key: r.stats(args.warmup) for r in timed}
    model_desc = args.model_preset + (" " + " ".join(args.model_set) if args.model_set else "")
    print(f"\nmodel {model_desc} ({sum(units.values()) / 1e6:.2f}M parameters, {len(units)} ZeRO units) | "
          f"{NPROC} ranks x 1 thread | micro-batch {args.micro_batch} x seq {args.seq_len} per rank | "
          f"{args.steps} steps, first {args.warmup} dropped | {args.repeats} repeat(s), interleaved")
    print("2-core shared machine: step times are noisy (see min-max and repeat medians); compare only ratios "
          "measured in this run.")
    part1(R, S, args)
    part2(R, S, args)
    part3(timed[:10] + mem_only, args)
    part4(timed, R, args)
    part5(R, S, args, train_config["model"]["vocab_size"])
    sanity(timed, args)
    print(f"total wall time {time.time() - t_start:.0f} s; load average before {load:.2f}, now {os.getloadavg()[0]:.2f}")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"per-run metrics.jsonl / memory.json files are under {work}")


if __name__ == "__main__":
    main()
