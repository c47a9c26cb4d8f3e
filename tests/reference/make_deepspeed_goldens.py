#!/usr/bin/env python3
"""Golden values for DeepSpeed's optimizer types and LR schedulers as shardlm implements them
(optim/adamw.h, optim/lr_schedule.h; tests/unit/optim/test_deepspeed_optim.cpp reads them).

    PYTHONPATH=<deepspeed-0.19.8 source>:$PYTHONPATH python tests/reference/make_deepspeed_goldens.py

writes tests/golden/deepspeed_optim.json and tests/golden/deepspeed_lr.json. The test does not need
DeepSpeed; this script does, for the schedulers, which are DeepSpeed's own classes
(deepspeed/runtime/lr_schedules.py of the pinned 0.19.8, scripts/requirements-peers.txt: `pip download
--no-deps --no-binary :all: deepspeed==0.19.8` and put the unpacked source first on PYTHONPATH; they
need torch and pydantic, hjson, psutil, py-cpuinfo, msgpack, ninja) driven as DeepSpeed's engine drives
them: built at iteration -1, the optimizer step run with the lr the scheduler last set, then
scheduler.step(). The optimizers are CUDA kernels (FusedAdam, FusedLamb) that cannot run here, so:
- Adam with adam_w_mode=false is torch.optim.Adam (weight_decay per group), which is FusedAdam's
  ADAM_MODE_0 arithmetic (csrc/adam/multi_tensor_adam.cu) and what DeepSpeed builds under torch_adam;
- bias_correction=false and Lamb are DeepSpeed's kernel arithmetic transcribed below in float64
  (csrc/adam/multi_tensor_adam.cu AdamFunctor; csrc/lamb/fused_lamb_cuda_kernel.cu
  lamb_cuda_kernel_part1/2/3 and fused_lamb_cuda). The kernel keeps its scalars (step_size, the
  trust ratio) in float32; the transcription keeps them in float64, the arithmetic shardlm runs.
Everything is float64, so the test compares to 1e-12.

    /opt/shardlm/venv/bin/python tests/reference/make_deepspeed_goldens.py --check

recomputes the optimizer steps (not the schedulers, which need DeepSpeed) from the inputs stored in
deepspeed_optim.json (each case's init and grads) and compares them with the file: equal up to 1e-15
relative (torch's own Adam, in the adam_l2 case, is vectorized per CPU: its ATEN_CPU_CAPABILITY=default
path ends one element 1 ulp, 1.8e-16 relative, from its AVX2 path; the C++ test compares to 1e-12).
"""
import argparse
import json
import sys
import math
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 5


def start():
    g = torch.Generator().manual_seed(24)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    b = torch.zeros(3, dtype=torch.float64)  # ||b|| = 0 at first: Lamb's ratio is then 1
    grads = [(torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64))
             for _ in range(STEPS)]
    return w, b, grads


def fused_adam_step(p, g, m, v, step, lr, b1, b2, eps, wd, adam_w_mode, bias_correction):
    """multi_tensor_adam.cu AdamFunctor, one tensor."""
    bc1 = 1 - b1 ** step if bias_correction else 1.0
    bc2 = 1 - b2 ** step if bias_correction else 1.0
    if not adam_w_mode:  # ADAM_MODE_0: L2
        g = g + wd * p
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        denom = (v / bc2).sqrt() + eps
        p.sub_(lr * ((m / bc1) / denom))
    else:  # ADAM_MODE_1: decoupled
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        denom = (v / bc2).sqrt() + eps
        p.sub_(lr * ((m / bc1) / denom + wd * p))


def fused_lamb_step(p, g, m, v, step, lr, b1, b2, eps, wd, bias_correction, max_coeff, min_coeff, eps_inside_sqrt):
    """fused_lamb_cuda_kernel.cu: part1 (moments, norms), part3 (trust ratio, update)."""
    step_size = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step) if bias_correction else lr
    m.mul_(b1).add_((1 - b1) * g)
    v.mul_(b2).add_((1 - b2) * g * g)
    denom = (v + eps).sqrt() if eps_inside_sqrt else v.sqrt() + eps
    update = m / denom + wd * p
    reg_w, reg_u = p.norm().item(), update.norm().item()
    coeff = 1.0
    if reg_w != 0 and reg_u != 0:
        coeff = reg_w / reg_u
        coeff = max_coeff if coeff > max_coeff else coeff
        coeff = min_coeff if coeff < min_coeff else coeff
    p.sub_(step_size * coeff * update)
    return coeff


def stored_start(case):
    """A case's inputs as the committed deepspeed_optim.json holds them."""
    w = torch.tensor(case["init"]["w"], dtype=torch.float64).reshape(4, 3)
    b = torch.tensor(case["init"]["b"], dtype=torch.float64)
    grads = [(torch.tensor(g["w"], dtype=torch.float64).reshape(4, 3), torch.tensor(g["b"], dtype=torch.float64))
             for g in case["grads"]]
    return w, b, grads


def optimizer_cases(stored=None):
    """stored: the committed cases, whose inputs are used instead of drawing them."""
    cases = []
    common = dict(lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.1)
    specs = [
        ("adam_l2", dict(common, rule="AdamL2", bias_correction=True)),
        ("adam_l2_no_bias_correction", dict(common, rule="AdamL2", bias_correction=False)),
        ("adamw_no_bias_correction", dict(common, rule="AdamW", bias_correction=False)),
        ("lamb", dict(common, rule="Lamb", bias_correction=True, max_coeff=10.0, min_coeff=0.01,
                      eps_inside_sqrt=False)),
        # bing_bert's DeepSpeedExamples settings: no bias correction, the ratio clamped at 0.3
        ("lamb_bing_bert", dict(lr=11e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, rule="Lamb",
                                bias_correction=False, max_coeff=0.3, min_coeff=0.01, eps_inside_sqrt=False)),
        ("lamb_eps_inside_sqrt", dict(common, rule="Lamb", bias_correction=True, max_coeff=10.0, min_coeff=0.01,
                                      eps_inside_sqrt=True)),
    ]
    for i, (name, o) in enumerate(specs):
        w, b, grads = stored_start(stored[i]) if stored else start()
        case = {"name": name, "options": o, "init": {"w": w.flatten().tolist(), "b": b.tolist()},
                "grads": [{"w": gw.flatten().tolist(), "b": gb.tolist()} for gw, gb in grads], "after": [],
                "lamb_coeffs": []}
        b1, b2 = o["betas"]
        if name == "adam_l2":  # torch.optim.Adam itself; decay on w only (shardlm: tensors with >= 2 dims)
            pw, pb = w.clone().requires_grad_(), b.clone().requires_grad_()
            opt = torch.optim.Adam([{"params": [pw], "weight_decay": o["weight_decay"]},
                                    {"params": [pb], "weight_decay": 0.0}], lr=o["lr"], betas=(b1, b2), eps=o["eps"],
                                   foreach=False)
            for gw, gb in grads:
                pw.grad, pb.grad = gw.clone(), gb.clone()
                opt.step()
                case["after"].append({"w": pw.detach().flatten().tolist(), "b": pb.detach().tolist()})
        else:
            state = {k: (torch.zeros_like(t), torch.zeros_like(t)) for k, t in (("w", w), ("b", b))}
            params = {"w": w, "b": b}
            for step, (gw, gb) in enumerate(grads, start=1):
                coeffs = []
                for k, g in (("w", gw), ("b", gb)):
                    wd = o["weight_decay"] if k == "w" else 0.0
                    m, v = state[k]
                    if o["rule"] == "Lamb":
                        coeffs.append(fused_lamb_step(params[k], g, m, v, step, o["lr"], b1, b2, o["eps"], wd,
                                                      o["bias_correction"], o["max_coeff"], o["min_coeff"],
                                                      o["eps_inside_sqrt"]))
                    else:
                        fused_adam_step(params[k], g, m, v, step, o["lr"], b1, b2, o["eps"], wd,
                                        o["rule"] == "AdamW", o["bias_correction"])
                case["after"].append({"w": w.flatten().tolist(), "b": b.tolist()})
                case["lamb_coeffs"].append(coeffs)
        cases.append(case)
    return cases


def lr_cases():
    from deepspeed.runtime import lr_schedules  # the pinned DeepSpeed's own classes
    specs = [
        ("WarmupLR", dict(warmup_min_lr=0.0, warmup_max_lr=3e-4, warmup_num_steps=10), 30),
        ("WarmupLR", dict(warmup_min_lr=1e-5, warmup_max_lr=3e-4, warmup_num_steps=10, warmup_type="linear"), 30),
        ("WarmupLR", dict(warmup_min_lr=0.0, warmup_max_lr=3e-4, warmup_num_steps=1), 6),
        ("WarmupDecayLR", dict(total_num_steps=40, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=8), 50),
        ("WarmupDecayLR", dict(total_num_steps=40, warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=8,
                               warmup_type="linear"), 50),
        ("WarmupCosineLR", dict(total_num_steps=40, warmup_min_ratio=0.0, warmup_num_steps=8, cos_min_ratio=1e-4), 50),
        ("WarmupCosineLR", dict(total_num_steps=40, warmup_min_ratio=0.1, warmup_num_steps=8, cos_min_ratio=0.1,
                                warmup_type="linear"), 50),
        ("WarmupCosineLR", dict(total_num_steps=5, warmup_min_ratio=0.0, warmup_num_steps=8, cos_min_ratio=0.1), 12),
    ]
    out = []
    for kind, params, steps in specs:
        lr = 2e-3  # the optimizer's lr (WarmupCosineLR scales it)
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=lr)
        sched = getattr(lr_schedules, kind)(opt, **params)
        lrs = []
        for _ in range(steps):
            lrs.append(opt.param_groups[0]["lr"])  # the lr optimizer.step() uses
            sched.step()
        out.append({"type": kind, "params": params, "optimizer_lr": lr, "lr_per_step": lrs})
    return out


def differences(made, saved, where="cases"):
    """Where `made` and `saved` (JSON values) differ by more than CHECK_RTOL; NaN never matches."""
    if isinstance(saved, dict):
        if not isinstance(made, dict) or made.keys() != saved.keys():
            return [where]
        return [d for k in saved for d in differences(made[k], saved[k], f"{where}.{k}")]
    if isinstance(saved, list):
        if not isinstance(made, list) or len(made) != len(saved):
            return [where]
        return [d for i, (m, s) in enumerate(zip(made, saved)) for d in differences(m, s, f"{where}[{i}]")]
    if isinstance(saved, float) and isinstance(made, (int, float)):
        return [] if abs(made - saved) <= CHECK_RTOL * abs(saved) else [f"{where}: {made!r} != {saved!r}"]
    return [] if made == saved else [f"{where}: {made!r} != {saved!r}"]


CHECK_RTOL = 1e-15


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="recompute the optimizer cases from deepspeed_optim.json's inputs and compare, write nothing")
    golden = os.path.join(ROOT, "tests", "golden")
    if ap.parse_args().check:
        path = os.path.join(golden, "deepspeed_optim.json")
        with open(path) as f:
            saved = json.load(f)["cases"]
        bad = differences(json.loads(json.dumps(optimizer_cases(saved))), saved)
        if bad:
            sys.exit(f"{path} differs from what the script makes: {bad[:5]}")
        print("golden matches (%d optimizer cases)" % len(saved))
        return
    with open(os.path.join(golden, "deepspeed_optim.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": optimizer_cases()}, f, indent=1)
        f.write("\n")
    import deepspeed
    with open(os.path.join(golden, "deepspeed_lr.json"), "w") as f:
        json.dump({"deepspeed": deepspeed.__version__, "cases": lr_cases()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
