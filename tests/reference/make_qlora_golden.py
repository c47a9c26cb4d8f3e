#!/usr/bin/env python3
"""Golden values for QLoRA against PEFT + bitsandbytes (issue 42; src/model/quant/quantized_base.h,
docs/qlora.md).

    /opt/shardlm/venv/bin/python tests/reference/make_qlora_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_qlora_golden.py --check   # recompute, compare

The pinned transformers loads the LoRA golden's tiny Llama (tests/golden/lora/base, fp32) with
BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=<nf4|fp4>, bnb_4bit_use_double_quant=<dq>,
bnb_4bit_compute_dtype=float32) on the CPU: the pinned bitsandbytes quantizes every decoder linear. The
pinned peft loads the adapters of tests/golden/lora/adapter_init onto it (trainable). On that golden's
ids and targets it records, per <qt>.<dq> (dq: "dq" or "plain"):
  <qt>.<dq>.logits      [2, 12, 64] float32
  <qt>.<dq>.loss        [1] the mean cross-entropy
  <qt>.<dq>.grad.<name> the loss's gradient of each adapter tensor (PEFT's names, as in the adapter file)
into tests/golden/qlora.safetensors; tests/unit/model/test_qlora_parity.cpp reproduces the loss to 1e-4
(absolute) and the logits and gradients to 1e-5 relative. --check recomputes and compares to 1e-6
relative (torch's CPU kernels on another host may round differently in the last bit).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LORA = os.path.join(ROOT, "tests", "golden", "lora")
OUT = os.path.join(ROOT, "tests", "golden", "qlora.safetensors")


def run(quant_type, double_quant, ids, targets):
    import peft
    import transformers
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                          bnb_4bit_use_double_quant=double_quant,
                                          bnb_4bit_compute_dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(LORA, "base"), quantization_config=bnb,
                                                             dtype=torch.float32, device_map="cpu")
    model = peft.PeftModel.from_pretrained(base, os.path.join(LORA, "adapter_init"), is_trainable=True)
    model.train()
    logits = model(input_ids=ids).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    key = f"{quant_type}.{'dq' if double_quant else 'plain'}"
    out = {f"{key}.logits": logits.detach(), f"{key}.loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        if p.requires_grad:
            out[f"{key}.grad.base_model.model.{n.removeprefix('base_model.model.').replace('.default', '')}"] = \
                p.grad.detach().clone()
    return out


def build():
    exp, _ = safetensors_py.load_file(os.path.join(LORA, "expected.safetensors"))
    store = {}
    for qt in ("nf4", "fp4"):
        for dq in (False, True):
            store.update(run(qt, dq, exp["ids"], exp["targets"]))
    return store


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    store = build()
    if not args.check:
        import bitsandbytes
        import peft
        safetensors_py.save_file(store, OUT, {"made_by": "tests/reference/make_qlora_golden.py",
                                              "bitsandbytes": bitsandbytes.__version__, "peft": peft.__version__})
        print("wrote", OUT)
        return
    have, _ = safetensors_py.load_file(OUT)
    bad = [k for k in store if k not in have or have[k].shape != store[k].shape
           or not float((have[k] - store[k]).abs().max()) <= 1e-6 * max(float(store[k].abs().max()), 1e-30)]
    if bad or set(have) != set(store):
        sys.exit(f"{OUT} differs from what PEFT + bitsandbytes compute now: {(bad or sorted(set(have) ^ set(store)))[:5]}")
    print("golden matches")


if __name__ == "__main__":
    main()
