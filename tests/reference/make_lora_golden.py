#!/usr/bin/env python3
"""Golden values for LoRA fine-tuning against PEFT (issue 42; src/model/lora.h, docs/lora.md).

    /opt/shardlm/venv/bin/python tests/reference/make_lora_golden.py           # write tests/golden/lora/
    /opt/shardlm/venv/bin/python tests/reference/make_lora_golden.py --check   # recompute, compare

The pinned transformers builds a tiny LlamaForCausalLM (fp32, seed 0) and the pinned peft wraps it with
LoraConfig(r=4, lora_alpha=8, lora_dropout=0, target_modules="all-linear", rank_pattern
{"down_proj": 2}, alpha_pattern {"o_proj": 4}) -- every linear but the head, and both patterns. B is
then drawn nonzero (normal, std 0.05) so that the adapters change the logits from the start. Written:
  base/                     config.json + model.safetensors (the frozen base, save_pretrained)
  adapter_init/             adapter_model.safetensors + adapter_config.json (PeftModel.save_pretrained)
  expected.safetensors      ids, targets [2, 12]; logits0 (before training); loss.0..2 (the loss of
                            each of 3 torch.optim.AdamW steps: lr 1e-2, betas (0.9, 0.999), eps 1e-8,
                            weight_decay 0.1); logits3 (after them); after.<PEFT name> (adapters after)
tests/unit/train/test_lora_parity.cpp reproduces them (fp32 <= 1e-5 relative). --check regenerates
into memory and compares with the committed files to 1e-6 (torch's CPU kernels on another host may
round differently in the last bit).
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "lora")


def build(out):
    import peft
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-6, tie_word_embeddings=False)
    base = transformers.LlamaForCausalLM(cfg).float()
    base.save_pretrained(os.path.join(out, "base"), safe_serialization=True)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                           rank_pattern={"down_proj": 2}, alpha_pattern={"o_proj": 4}, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, lcfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(os.path.join(out, "adapter_init"))
    for extra in ("adapter_init/README.md", "base/generation_config.json"):  # a model card; generation only
        os.remove(os.path.join(out, extra))
    ids = torch.randint(0, 64, (2, 13), generator=g)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    model.train()
    exp = {"ids": inputs, "targets": targets}
    with torch.no_grad():
        exp["logits0"] = model(input_ids=inputs).logits.float()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    for step in range(3):
        logits = model(input_ids=inputs).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        exp[f"loss.{step}"] = loss.detach().reshape(1)
    with torch.no_grad():
        exp["logits3"] = model(input_ids=inputs).logits.float()
    for n, t in peft.get_peft_model_state_dict(model).items():
        exp["after.base_model.model." + n.removeprefix("base_model.model.")] = t.detach().clone()
    return exp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not args.check:
        exp = build(OUT)
        safetensors_py.save_file(exp, os.path.join(OUT, "expected.safetensors"))
        print("wrote", OUT)
        return
    with tempfile.TemporaryDirectory() as tmp:
        exp = build(tmp)
        have = safetensors_py.load_file(os.path.join(OUT, "expected.safetensors"))[0]
        bad = []
        for name, t in exp.items():
            h = have.get(name)
            if h is None or h.shape != t.shape:
                bad.append(f"{name}: missing or of another shape")
            elif t.dtype.is_floating_point:
                err = float((h - t).abs().max() / max(float(t.abs().max()), 1e-30))
                if not err <= 1e-6:
                    bad.append(f"{name}: relative difference {err:.3g}")
            elif not torch.equal(h, t):
                bad.append(f"{name}: differs")
        if set(have) != set(exp):
            bad.append(f"names differ: {sorted(set(have) ^ set(exp))}")
        for d in ("base", "adapter_init"):
            for f in os.listdir(os.path.join(tmp, d)):
                if f.endswith(".safetensors"):
                    a = safetensors_py.load_file(os.path.join(tmp, d, f))[0]
                    b = safetensors_py.load_file(os.path.join(OUT, d, f))[0]
                    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
                        bad.append(f"{d}/{f} differs")
        if bad:
            print("tests/golden/lora differs from what PEFT computes now:\n  " + "\n  ".join(bad))
            sys.exit(1)
        print("tests/golden/lora: matches PEFT", json.dumps({"tensors": len(exp)}))


if __name__ == "__main__":
    main()
