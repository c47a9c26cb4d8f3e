#!/usr/bin/env python3
"""Golden steps of DeepSpeed's CPU Adam over bf16 masters (bf16.bf16_master_weights_and_grads).

    /opt/shardlm/venv/bin/python tests/reference/make_deepspeed_cpu_adam_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_deepspeed_cpu_adam_golden.py --check   # compare with it

The file stores its inputs (init.*, grad.*); --check reads them back and recomputes only the outputs,
so it does not depend on how this host's torch.randn and torch.exp round.

DeepSpeed 0.19.8 steps bf16 masters (ZeRO-Offload with bf16_master_weights_and_grads) with its CPU
Adam, DeepSpeedCPUAdam, whose C++ kernel is Adam_Optimizer::Step_1 (deepspeed/ops/csrc/adam/
cpu_adam_impl.cpp) with the constants of deepspeed/ops/csrc/includes/cpu_adam.h. This script is that
arithmetic written out in numpy float32, one IEEE single operation at a time, as the scalar loop of
Step_1 reads (the loop a host without AVX-512 runs for bf16 tensors, cpu_adam.h Step_AVX returning
early there):
  - the constants are float: beta1, beta2, lr, eps and weight_decay passed as float
    (ops/adam/cpu_adam.py), 1 - beta in float, beta^t accumulated by one float multiplication a step
    (IncrementStep: _betta1_t *= _betta1), bias_correction1 = 1 - beta1^t and
    bias_correction2 = 1 / sqrt(1 - beta2^t) in float (update_state), step_size = -1 * lr / bc1 and
    w_decay = -1 * lr * wd in float;
  - each element is widened to float (bf16 params and gradients; fp32 or bf16 moments) and updated:
      Adam (adamw_mode false):  g = p * wd + g
      m = m * b1;  m = g * (1 - b1) + m
      v = v * b2;  g = g * g;  v = g * (1 - b2) + v
      d = sqrt(v);  d = d * bc2 + eps;  u = m / d
      AdamW:  p += w_decay * p
      p = u * step_size + p
  - p, m and v are stored once each, rounded to nearest even when bf16 (c10::BFloat16(float)); the
    update used the unrounded m and v. No Kahan summation, no stochastic rounding.
Two things the source leaves to the compiler are taken as written: no multiply-add is fused (GCC's
default -ffp-contract=fast may fuse them on an FMA host, and the AVX-512 body fuses them explicitly:
cpu_adam.h simd_fma), and sqrt of a float is the float sqrt (a double sqrt rounded to float gives the
same sqrt; in 1 / sqrt(1 - beta2^t) it may move bc2 by one float ulp). Either changes a result by about
one float ulp, well under a bf16 ulp; tests/unit/optim/test_deepspeed_cpu_adam.cpp, which steps
shardlm's AdamW (bf16 masters, master_rounding "nearest") from each of these states and compares, says
how many bf16 results differ.

Two parameters, "w" 32x72 in a param group with weight decay and "b" 200 in one without (a bias, as
Hugging Face groups them), six steps, three variants: AdamW with bf16 moments (bf16_optimizer_states
true), AdamW with fp32 moments (false), Adam with L2 decay (adam_w_mode false) with bf16 moments. Each
step's state after the step is stored, so a test can start each step from DeepSpeed's state before it.
Written to tests/golden/deepspeed_cpu_adam.safetensors.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "deepspeed_cpu_adam.safetensors")
F32 = np.float32
LR, B1, B2, EPS, WD, STEPS = 1e-2, 0.9, 0.999, 1e-8, 0.01, 6
SHAPES = {"w": ((32, 72), True), "b": ((200,), False)}  # name: (shape, in the weight-decay group)
VARIANTS = [("adamw", "bf16"), ("adamw", "fp32"), ("adam_l2", "bf16")]


def bf(x):
    """Round float32 values to bf16 (nearest even, torch's c10::BFloat16), held as float32."""
    return torch.from_numpy(np.ascontiguousarray(x, F32)).to(torch.bfloat16).float().numpy()


def deepspeed_steps(init, grads, rule, moments):
    """DeepSpeed's CPU Adam, Step_1's scalar loop, over STEPS steps; the state after each."""
    alpha, b1, b2, eps = F32(LR), F32(B1), F32(B2), F32(EPS)
    adamw = rule == "adamw"
    p = {k: v.reshape(-1).copy() for k, v in init.items()}  # bf16 values held in float32
    m = {k: np.zeros(v.size, F32) for k, v in p.items()}
    v2 = {k: np.zeros(v.size, F32) for k, v in p.items()}
    b1t, b2t = F32(1.0), F32(1.0)
    out = {}
    for t in range(1, STEPS + 1):
        b1t, b2t = F32(b1t * b1), F32(b2t * b2)          # IncrementStep
        bc1 = F32(F32(1) - b1t)                            # update_state
        bc2 = F32(F32(1) / np.sqrt(F32(F32(1) - b2t)))
        b1m, b2m = F32(F32(1) - b1), F32(F32(1) - b2)      # Step_1
        step_size = F32(F32(-1 * alpha) / bc1)
        for k, (_, decayed) in SHAPES.items():
            wd = F32(WD if decayed else 0.0)
            w_decay = F32(F32(-1 * alpha) * wd)
            g = grads[t - 1][k].reshape(-1).astype(F32)
            param = p[k].astype(F32)
            if wd > 0 and not adamw:
                g = (param * wd).astype(F32) + g
            mk = (m[k] * b1).astype(F32)
            mk = ((g * b1m).astype(F32) + mk).astype(F32)
            vk = (v2[k] * b2).astype(F32)
            gg = (g * g).astype(F32)
            vk = ((gg * b2m).astype(F32) + vk).astype(F32)
            d = np.sqrt(vk).astype(F32)
            d = ((d * bc2).astype(F32) + eps).astype(F32)
            u = (mk / d).astype(F32)
            if wd > 0 and adamw:
                param = (param + (w_decay * param).astype(F32)).astype(F32)
            param = ((u * step_size).astype(F32) + param).astype(F32)
            p[k] = bf(param)
            m[k], v2[k] = (bf(mk), bf(vk)) if moments == "bf16" else (mk, vk)
            tag, shape = f"{rule}.{moments}", init[k].shape
            out[f"{tag}.param.{t}.{k}"] = p[k].reshape(shape).copy()
            out[f"{tag}.exp_avg.{t}.{k}"] = m[k].reshape(shape).copy()
            out[f"{tag}.exp_avg_sq.{t}.{k}"] = v2[k].reshape(shape).copy()
    return out


def draw_inputs():
    """bf16 weights of several scales (a bf16 ulp from 2^-16 to 2^-6) and bf16 gradients spread over
    decades, drawn when the golden is written."""
    torch.manual_seed(0)
    init = {k: bf((torch.randn(s) * torch.exp(torch.randn(s)) * 0.3).numpy()) for k, (s, _) in SHAPES.items()}
    grads = [{k: bf((torch.randn(s) * torch.exp(torch.randn(s)) * 1e-2).numpy()) for k, (s, _) in SHAPES.items()}
             for _ in range(STEPS)]
    return init, grads


def read_inputs():
    """The inputs the committed golden was made from."""
    return safetensors_py.stored_optimizer_inputs(OUT, SHAPES, STEPS)


def build(init, grads):
    tensors = {}
    for k in init:
        tensors[f"init.{k}"] = init[k]
        for t in range(STEPS):
            tensors[f"grad.{t + 1}.{k}"] = grads[t][k]
    for rule, moments in VARIANTS:
        tensors.update(deepspeed_steps(init, grads, rule, moments))
    meta = {"deepspeed": "0.19.8 (ops/csrc/adam/cpu_adam_impl.cpp Step_1, ops/csrc/includes/cpu_adam.h)",
            "lr": LR, "betas": [B1, B2], "eps": EPS, "weight_decay": WD, "steps": STEPS,
            "decay": {k: d for k, (_, d) in SHAPES.items()}, "variants": [f"{r}.{m}" for r, m in VARIANTS]}
    return tensors, meta


def stored(tensors):
    """bf16 where DeepSpeed holds bf16 (parameters, gradients, bf16 moments); fp32 moments stay float32."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if ".fp32.exp_avg" in k
            else torch.from_numpy(np.ascontiguousarray(v)).bfloat16() for k, v in tensors.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DeepSpeed CPU Adam golden over bf16 masters")
    parser.add_argument("--check", action="store_true", help="compare with the checked-in file instead of writing it")
    check = parser.parse_args().check
    golden, meta = build(*(read_inputs() if check else draw_inputs()))
    safetensors_py.write_or_check(stored(golden), OUT, "tests/reference/make_deepspeed_cpu_adam_golden.py", meta, check)
