#!/usr/bin/env python3
"""The mixture-of-experts demo against the dense demo at equal active parameters (issue 25):
configs/moe_demo.json (Mixtral: 8 experts of width 512, top-2, router_aux_loss_coef 0.02) and
configs/demo.json (one MLP of width 1024) differ only in the MLP, and every token of the MoE runs
through two experts of width 512: the same multiply-adds per token as the dense MLP, with 4x its
MLP parameters in all.

    /opt/shardlm/venv/bin/python bench/moe_demo.py                  # 200 steps x 2 repeats: ~25 min
    /opt/shardlm/venv/bin/python bench/moe_demo.py --quick          # smoke run, ~3 min

Each run is `shardlm train --config <config> --nproc 2 --resume=false` (as scripts/demo.sh trains the
demo); dense and MoE runs alternate, so both see the same machine load. Per run: the last logged
training loss, the last validation loss, router_aux_loss (MoE), and tokens/s as the median over the
logged steps after --warmup (evaluation is timed apart by the trainer). The losses of repeats are
identical (same seed, same data); the spread of tokens/s over repeats is shown, with the load
average. Results are printed and written to --out as JSON (bench/results/moe_demo.json is the
checked-in measurement).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, add_run_length_args, clean_env, fresh_dir, parse_run_length_args, read_metrics, run_checked  # noqa: E402

CONFIGS = {"dense": "configs/demo.json", "moe": "configs/moe_demo.json"}
FULL = {"steps": 200, "warmup": 20, "repeats": 2, "micro_batch": 8, "seq_len": 128}
QUICK = {"steps": 30, "warmup": 10, "repeats": 1, "micro_batch": 8, "seq_len": 128}


def parameter_counts(model):
    """(total, active per token) parameters of an HF config dict (the demo preset's shape fields
    written out), counted as the model holds them: untied embedding and head, no biases."""
    H, L, V = model["hidden_size"], model["num_hidden_layers"], model["vocab_size"]
    heads, kv = model["num_attention_heads"], model["num_key_value_heads"]
    d = H // heads
    attn = H * heads * d * 2 + H * kv * d * 2  # q, o; k, v
    norms = 2 * H
    E, k = model.get("num_local_experts", 0), model.get("num_experts_per_tok", 0)
    expert = 3 * H * model["intermediate_size"]
    mlp_total = E * expert + E * H if E else expert  # experts and router
    mlp_active = k * expert + E * H if E else expert
    outer = 2 * V * H + H  # embedding, head, final norm
    return outer + L * (attn + norms + mlp_total), outer + L * (attn + norms + mlp_active)


def model_fields(config_path):
    cfg = json.loads((Path(REPO) / config_path).read_text())
    m = dict(cfg["model"])
    if m.get("preset") == "demo":  # the dense demo preset's shape (src/model/llama_config.cpp)
        m = {"vocab_size": 4096, "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6,
             "num_attention_heads": 6, "num_key_value_heads": 2}
    return m


def one_run(args, name, repeat):
    out_dir = fresh_dir(Path(args.work_dir) / f"{name}_{repeat}")
    cmd = [args.shardlm, "train", "--config", CONFIGS[name], "--nproc", "2", "--resume=false",
           f"--steps={args.steps}", f"--out_dir={out_dir}", f"--train_micro_batch_size_per_gpu={args.micro_batch}",
           f"--data.seq_len={args.seq_len}", "--checkpoint_interval=0", "--log_interval=1",
           f"--eval_interval={max(1, args.steps // 4)}"]
    load = os.getloadavg()[0]
    t0 = time.time()
    run_checked(cmd, clean_env(None), f"{name} demo")
    seconds = time.time() - t0
    rows = read_metrics(out_dir / "metrics.jsonl")
    train = [r for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    tps = [r["tokens_per_s"] for r in train if r["step"] > args.warmup and "tokens_per_s" in r]
    aux = [r["router_aux_loss"] for r in train if "router_aux_loss" in r]
    return {"final_loss": train[-1]["loss"], "val_loss": val[-1] if val else None,
            "router_aux_loss_last": aux[-1] if aux else None, "tokens_per_s_median": statistics.median(tps),
            "seconds": round(seconds, 1), "load_average_1m_at_start": load}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_length_args(p, FULL, QUICK, "~3 min")
    p.add_argument("--work-dir", default="/tmp/shardlm_moe_demo")
    p.add_argument("--out", default=str(Path(REPO) / "bench" / "results" / "moe_demo.json"))
    p.add_argument("--shardlm", default=str(Path(REPO) / "build" / "shardlm"))
    args = parse_run_length_args(p, FULL, QUICK)

    runs = {name: [] for name in CONFIGS}
    for repeat in range(args.repeats):
        for name in CONFIGS:  # alternating: both kinds see the same load
            r = one_run(args, name, repeat)
            runs[name].append(r)
            print(f"{name:>5} #{repeat}: loss {r['final_loss']:.4f}, val {r['val_loss']}, "
                  f"{r['tokens_per_s_median']:.0f} tok/s (load {r['load_average_1m_at_start']:.2f})", flush=True)
    results = {}
    for name, rs in runs.items():
        total, active = parameter_counts(model_fields(CONFIGS[name]))
        tps = [r["tokens_per_s_median"] for r in rs]
        results[name] = {"config": CONFIGS[name], "parameters_total": total, "parameters_active": active,
                         "final_loss": rs[0]["final_loss"], "val_loss": rs[0]["val_loss"],
                         "router_aux_loss_last": rs[0]["router_aux_loss_last"],
                         "losses_equal_over_repeats": all(r["final_loss"] == rs[0]["final_loss"] for r in rs),
                         "tokens_per_s_median": statistics.median(tps), "tokens_per_s_min": min(tps),
                         "tokens_per_s_max": max(tps), "runs": rs}
    d, m = results["dense"], results["moe"]
    ratios = {"active_parameters": m["parameters_active"] / d["parameters_active"],
              "total_parameters": m["parameters_total"] / d["parameters_total"],
              "tokens_per_s": m["tokens_per_s_median"] / d["tokens_per_s_median"],
              "final_loss": m["final_loss"] / d["final_loss"],
              "val_loss": (m["val_loss"] / d["val_loss"]) if m["val_loss"] and d["val_loss"] else None}
    print(f"MoE / dense: active parameters {ratios['active_parameters']:.3f}x, total {ratios['total_parameters']:.2f}x, "
          f"tokens/s {ratios['tokens_per_s']:.3f}x, final loss {ratios['final_loss']:.4f}x, val loss {ratios['val_loss']}")
    record = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "micro_batch": args.micro_batch, "seq_len": args.seq_len, "ranks": 2,
              "cpu": os.popen("lscpu | grep 'Model name'").read().strip(), "results": results,
              "moe_over_dense": ratios}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
