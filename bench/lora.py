#!/usr/bin/env python3
"""Full fine-tuning vs LoRA vs QLoRA on a >= 100M-parameter Llama, side by side (issue 42; docs/lora.md).

Why this file exists: the issue asks, on this machine, that a LoRA r = 16 run's memory (base, adapters'
states, activations) be planned within 10%, that a LoRA step take <= 0.75x the full fine-tuning step of
the same model and batch, and that QLoRA's step take <= 1.3x LoRA's. This runs the real trainer
(`shardlm train`, one process) on a Llama built locally from the config below (random weights, no hub:
12 layers of 768, MLP 2048, 32000-token vocabulary, 134M parameters), fp32, one sequence of 256 tokens
per step, in three modes: every weight trained; LoRA r = 16 on every linear but the head; the same
adapters on an NF4 double-quantized base. Each repeat runs the three modes one after the other
(interleaved, so load drifts touch all three alike), `--steps` steps each; a run's step time is the
median of its steps after the first (metrics.jsonl's step_time_s), and its CPU seconds likewise
(step_cpu_s: every thread's; on a host shared with other work, wall time measures the sharing too). Its peak is memory.json's model states
+ frozen base + the resident set's growth over the first forward and backward, beside plan.json's total
(the trainer's own plan). Median, min and max over the repeats, and the load average before and after
each run (the host is shared), go to bench/results/lora.json.

    /opt/shardlm/venv/bin/python bench/lora.py [--repeats 5] [--steps 4] [--json bench/results/lora.json]
    (SHARDLM=path/to/shardlm picks another binary than build/shardlm)
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARDLM = Path(os.environ.get("SHARDLM", REPO / "build" / "shardlm"))
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
         "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
         "num_key_value_heads": 12, "vocab_size": 32000, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
LORA = {"enabled": True, "r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
MODES = {
    "full": {},
    "lora": {"lora": LORA},
    "qlora": {"lora": LORA, "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                             "bnb_4bit_use_double_quant": True}},
}


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def load_average():
    return open("/proc/loadavg").read().split()[:3]


def tokens(path, n=1 << 16):
    """An llm.c token file (header of 256 int32, then uint16 tokens) of a fixed pseudo-random stream."""
    import struct
    header = [20240520, 1, n] + [0] * 253
    x, data = 12345, []
    for _ in range(n):
        x = (1103515245 * x + 12345) % (1 << 31)
        data.append(x % 32000)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *data))


def run_mode(tmp, mode, steps, threads):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "scheduler": {"type": "constant"}, "model": MODEL,
           "data": {"train": str(Path(tmp) / "train.bin"), "seq_len": 256}, "steps": steps, "seed": 1,
           "log_interval": 1, "checkpoint_interval": 0, "threads": threads, **MODES[mode]}
    out_dir = Path(tmp) / mode
    path = Path(tmp) / f"{mode}.json"
    path.write_text(json.dumps(cfg))
    before = load_average()
    p = subprocess.run([str(SHARDLM), "train", "--config", str(path), f"--out_dir={out_dir}", "--resume=false"],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"{mode}: shardlm train failed ({p.returncode}):\n{p.stderr[-4000:]}")
    records = [json.loads(line) for line in open(out_dir / "metrics.jsonl") if '"step_time_s"' in line]
    memory = json.loads((out_dir / "memory.json").read_text())
    plan = json.loads((out_dir / "plan.json").read_text())["stages"][0]
    peak = memory["total_model_states"] + memory.get("frozen_base", 0) + memory["activations_measured"]
    phases = {k: statistics.median(r.get(f"time_{k}_s", 0.0) for r in records[1:])
              for k in ("forward", "backward", "optimizer")}
    return {"step_s": statistics.median(r["step_time_s"] for r in records[1:]), "phases_s": phases,
            "step_cpu_s": statistics.median(r.get("step_cpu_s", 0.0) for r in records[1:]), "peak_bytes": peak,
            "planned_bytes": plan["total"], "planned_low_bytes": plan["total"] - plan["backward_reusable"],
            "model_states": memory["total_model_states"], "frozen_base": memory.get("frozen_base", 0),
            "activations_held": memory["activations_held"], "planned_activations": plan["activations"],
            "load_before": before, "load_after": load_average()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "lora.json"))
    args = ap.parse_args()
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        tokens(Path(tmp) / "train.bin")
        for rep in range(args.repeats):
            for mode in MODES:
                r = run_mode(tmp, mode, args.steps, args.threads)
                runs[mode].append(r)
                print(f"repeat {rep + 1} {mode:5s}: step {r['step_s']:.3f} s ({r['step_cpu_s']:.3f} CPU s), peak {r['peak_bytes'] / 1e6:.0f} MB "
                      f"(planned {r['planned_low_bytes'] / 1e6:.0f}-{r['planned_bytes'] / 1e6:.0f} MB), load "
                      f"{' '.join(r['load_before'])} -> {' '.join(r['load_after'])}", flush=True)
            Path(args.json + ".partial").write_text(json.dumps(runs, indent=1) + "\n")  # every run so far
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": os.uname().nodename, "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                                           if l.startswith("model name")), ""),
              "model": MODEL, "lora": LORA, "micro_batch": 1, "seq_len": 256, "precision": "fp32",
              "threads": args.threads, "steps_per_run": args.steps, "repeats": args.repeats, "modes": {}}
    for mode, rs in runs.items():
        result["modes"][mode] = {
            "step_s": summary([r["step_s"] for r in rs]),
            "step_cpu_s": summary([r["step_cpu_s"] for r in rs]),
            "phases_s": {k: summary([r["phases_s"][k] for r in rs]) for k in ("forward", "backward", "optimizer")},
            "peak_bytes": summary([r["peak_bytes"] for r in rs]),
            "planned_bytes": rs[0]["planned_bytes"], "planned_low_bytes": rs[0]["planned_low_bytes"],
            "peak_over_plan": summary([r["peak_bytes"] / r["planned_bytes"] for r in rs]),
            "model_states": rs[0]["model_states"], "frozen_base": rs[0]["frozen_base"],
            "activations_held": summary([r["activations_held"] for r in rs]),
            "planned_activations": rs[0]["planned_activations"],
            "load": [[r["load_before"], r["load_after"]] for r in rs]}
    m = result["modes"]
    result["lora_over_full_step"] = m["lora"]["step_s"]["median"] / m["full"]["step_s"]["median"]
    result["qlora_over_lora_step"] = m["qlora"]["step_s"]["median"] / m["lora"]["step_s"]["median"]
    result["lora_over_full_step_cpu"] = m["lora"]["step_cpu_s"]["median"] / m["full"]["step_cpu_s"]["median"]
    result["qlora_over_lora_step_cpu"] = m["qlora"]["step_cpu_s"]["median"] / m["lora"]["step_cpu_s"]["median"]
    result["lora_over_full_peak"] = m["lora"]["peak_bytes"]["median"] / m["full"]["peak_bytes"]["median"]
    result["qlora_over_full_peak"] = m["qlora"]["peak_bytes"]["median"] / m["full"]["peak_bytes"]["median"]
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for mode, s in m.items():
        st, pk = s["step_s"], s["peak_bytes"]
        print(f"{mode:5s} step {st['median']:.3f} s [{st['min']:.3f}, {st['max']:.3f}]  peak {pk['median'] / 1e6:.0f} MB "
              f"[{pk['min'] / 1e6:.0f}, {pk['max'] / 1e6:.0f}]  planned {s['planned_bytes'] / 1e6:.0f} MB "
              f"(peak/plan {s['peak_over_plan']['median']:.3f})")
    print(f"LoRA/full step {result['lora_over_full_step']:.3f}x, QLoRA/LoRA step {result['qlora_over_lora_step']:.3f}x; "
          f"CPU seconds: {result['lora_over_full_step_cpu']:.3f}x, {result['qlora_over_lora_step_cpu']:.3f}x")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
