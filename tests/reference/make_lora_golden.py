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
  expected.safetensors      ids, targets [2, 12]; logits0 (before training), all outputs float64; loss.0..2 (the loss of
                            each of 3 torch.optim.AdamW steps: lr 1e-2, betas (0.9, 0.999), eps 1e-8,
                            weight_decay 0.1); logits3 (after them); after.<PEFT name> (adapters after)
The MoE cases (lora.target_parameters: PEFT's lora.ParamWrapper on the experts' 3-D weights) are the
same run on tiny models in their own directories, inputs drawn the same way:
  tests/golden/lora_mixtral/    MixtralForCausalLM, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] (the
                                wrappers nest: gate_up_proj's adapters under experts.base_layer), rank_pattern
                                {"down_proj": 3}, alpha_pattern {"gate_up_proj": 6})
  tests/golden/lora_qwen2_moe/  Qwen2MoeForCausalLM (shared expert; expert width 6 x 4 bytes, which torch's
                                grouped product cannot take: per-expert products), LoraConfig(r=2, lora_alpha=4,
                                target_parameters=["gate_up_proj"] only, no target_modules, use_rslora)
    make_lora_golden.py --case mixtral   # (re)draws one case; --check checks every case
tests/unit/train/test_lora_parity.cpp reproduces them (fp32 <= 1e-5 relative). --check reads the
committed inputs (base/, adapter_init/, ids, targets) and recomputes only the outputs, comparing them
with the committed ones to 1e-10 (float64: torch's CPU kernels on another host round differently only in
the last bits); it never redraws the inputs, whose random draws may differ between CPU kernels.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
OUT = os.path.join(GOLDEN, "lora")
CASES = {"llama": "lora", "mixtral": "lora_mixtral", "qwen2_moe": "lora_qwen2_moe"}


def save_peft_init(base, lcfg, out):
    """Wraps `base` in PEFT's adapters per `lcfg`, draws every lora_B nonzero (so the first step's
    gradients reach A too), saves the initial adapter and returns the generator for the ids."""
    import peft
    model = peft.get_peft_model(base, lcfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(os.path.join(out, "adapter_init"))
    return g


def draw_inputs(out):
    """The random inputs, drawn once and committed: the base, the initial adapter, ids and targets."""
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
    g = save_peft_init(base, lcfg, out)
    for extra in ("adapter_init/README.md", "base/generation_config.json"):  # a model card; generation only
        os.remove(os.path.join(out, extra))
    ids = torch.randint(0, 64, (2, 13), generator=g)
    return {"ids": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


def draw_moe_inputs(out, case):
    """A MoE case's inputs: a tiny Mixtral or Qwen2-MoE, PEFT's adapters on its experts' 3-D weights."""
    import peft
    import transformers
    torch.manual_seed(0)
    common = dict(vocab_size=32, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False, num_experts_per_tok=2)
    if case == "mixtral":
        cfg = transformers.MixtralConfig(intermediate_size=8, num_local_experts=4, **common)
        base = transformers.MixtralForCausalLM(cfg).float()
        lcfg = peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj"],
                               target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                               rank_pattern={"down_proj": 3}, alpha_pattern={"gate_up_proj": 6}, task_type="CAUSAL_LM")
    else:
        cfg = transformers.Qwen2MoeConfig(intermediate_size=10, moe_intermediate_size=6, shared_expert_intermediate_size=10,
                                          num_experts=4, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False,
                                          **common)
        base = transformers.Qwen2MoeForCausalLM(cfg).float()
        lcfg = peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_parameters=["gate_up_proj"],
                               use_rslora=True, task_type="CAUSAL_LM")
    base.save_pretrained(os.path.join(out, "base"), safe_serialization=True)
    g = save_peft_init(base, lcfg, out)
    for extra in ("adapter_init/README.md", "base/generation_config.json"):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    ids = torch.randint(0, 32, (2, 9), generator=g)
    return {"ids": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


def compute(out, inputs):
    """The outputs, from the committed inputs only: PEFT loads base/ and adapter_init/ and trains 3 steps
    in float64, so that the golden is the exact trajectory, the same on every CPU's kernels, which an fp32
    run of shardlm (1e-5) and a float64 one (1e-10) are held to."""
    import peft
    import transformers
    moe = json.load(open(os.path.join(out, "base", "config.json")))["model_type"] != "llama"
    # float64 experts: the eager loop over experts (torch's grouped_mm has no float64 kernel).
    extra = {"experts_implementation": "eager"} if moe else {}
    base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(out, "base"), torch_dtype=torch.float64,
                                                             **extra)
    model = peft.PeftModel.from_pretrained(base, os.path.join(out, "adapter_init"), is_trainable=True).double()
    ids, targets = inputs["ids"], inputs["targets"]
    model.train()
    exp = dict(inputs)
    with torch.no_grad():
        exp["logits0"] = model(input_ids=ids).logits
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    for step in range(3):
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        exp[f"loss.{step}"] = loss.detach().reshape(1)
    with torch.no_grad():
        exp["logits3"] = model(input_ids=ids).logits
    for n, t in peft.get_peft_model_state_dict(model).items():
        exp["after.base_model.model." + n.removeprefix("base_model.model.")] = t.detach().clone()
    return exp


def check(out):
    """Recomputes one case's outputs from its committed inputs; returns its problems."""
    have = safetensors_py.load_file(os.path.join(out, "expected.safetensors"))[0]
    exp = compute(out, {"ids": have["ids"], "targets": have["targets"]})
    bad = []
    for name, t in exp.items():
        h = have.get(name)
        if h is None or h.shape != t.shape:
            bad.append(f"{name}: missing or of another shape")
        elif t.dtype.is_floating_point:
            err = float((h - t).abs().max() / max(float(t.abs().max()), 1e-30))
            if not err <= 1e-10:
                bad.append(f"{name}: relative difference {err:.3g}")
        elif not torch.equal(h, t):
            bad.append(f"{name}: differs")
    if set(have) != set(exp):
        bad.append(f"names differ: {sorted(set(have) ^ set(exp))}")
    return [f"{os.path.relpath(out, ROOT)}: {b}" for b in bad], len(exp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--case", choices=sorted(CASES), default="llama", help="the golden to (re)draw (default llama)")
    ap.add_argument("--outputs-only", action="store_true", help="recompute expected.safetensors' outputs from "
                    "the committed inputs, drawing nothing")
    args = ap.parse_args()
    out = os.path.join(GOLDEN, CASES[args.case])
    if args.outputs_only:
        have = safetensors_py.load_file(os.path.join(out, "expected.safetensors"))[0]
        safetensors_py.save_file(compute(out, {"ids": have["ids"], "targets": have["targets"]}),
                                 os.path.join(out, "expected.safetensors"))
        print("rewrote the outputs of", out)
        return
    if not args.check:
        inputs = draw_inputs(out) if args.case == "llama" else draw_moe_inputs(out, args.case)
        safetensors_py.save_file(compute(out, inputs), os.path.join(out, "expected.safetensors"))
        print("wrote", out)
        return
    bad, tensors = [], 0
    for case in sorted(CASES):
        b, n = check(os.path.join(GOLDEN, CASES[case]))
        bad += b
        tensors += n
    if bad:
        print("tests/golden/lora* differs from what PEFT computes now:\n  " + "\n  ".join(bad))
        sys.exit(1)
    print("tests/golden/lora*: matches PEFT", json.dumps({"tensors": tensors}))


if __name__ == "__main__":
    main()
