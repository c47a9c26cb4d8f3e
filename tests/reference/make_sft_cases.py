#!/usr/bin/env python3
"""Masked fine-tuning references: what transformers and hf_llama.py train on the rows
`shardlm prepare --sft` writes, for tests/sft/test_sft_parity.cpp.

    make_sft_cases.py OUT_DIR SHARDLM_BINARY

For each case (padded and packed llama rows; packed mistral rows with a sliding window
shorter than the row) this script
  1. writes prompt/completion pairs of random lengths (pairs.jsonl) and runs
     `shardlm prepare --sft` on them with the bundled Brown tokenizer; or (chat_pack)
     multi-turn conversations, prepared with Llama 3.1's chat template and a small tokenizer
     holding its special tokens (make_chat_cases.py builds it);
  2. reads train.bin and train.bin.mask back with its own parser (tests/../loss_mask.h's
     layout) and checks the join rule: [BOS] + prompt + completion + EOS, loss on the
     completion and EOS only, rows of seq_len + 1, samples never split; or that each
     conversation is apply_chat_template's ids with the assistant-turn mask;
  3. builds a tiny model with transformers (seeded, save_pretrained: what the C++ test
     passes as `init`);
  4. trains STEPS optimizer steps on the global batches the trainer's data order gives
     (step s reads rows [GLOBAL*s, GLOBAL*(s+1)) whatever the layout: 2 ranks x
     accumulation 2 x micro-batch 2, or 1 rank x 2 x 4), each step's loss the summed
     cross-entropy over the global batch's counted targets divided by their number
     (transformers' num_items_in_batch), then clip_grad_norm_(1.0) and torch.optim.AdamW:
       - transformers' LlamaForCausalLM / MistralForCausalLM, float32, eager attention,
         labels = -100 where a target does not count (passed as shift_labels to the
         model's own loss_function), packed rows as DataCollatorWithFlattening gives them:
         position_ids restarting per sample and no attention_mask, so masking_utils finds
         the packed sequences and masks them block-diagonally;
       - hf_llama.py in float64 (the project's reference, packed masks transcribed);
  5. asserts that the global-batch loss differs from the mean of the four micro-batch
     means in step 1 (so a mean-of-means trainer fails the C++ bounds), and writes
     OUT_DIR/cases.json (losses per step, grad norms) and OUT_DIR/<case>/final_{fp32,fp64}.safetensors.
"""

import json
import os
import random
import shutil
import subprocess
import sys
from collections import OrderedDict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import hf_llama  # noqa: E402
import safetensors_py  # noqa: E402
from worst import worst as worst_of  # noqa: E402

SEQ_LEN = 24
CHAT_SEQ_LEN = 128  # Llama 3.1's system header alone is ~40 tokens of the small tokenizer
GLOBAL = 8  # rows per optimizer step (2 ranks x accumulation 2 x micro-batch 2)
STEPS = 3
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
MICRO_ROWS = 2  # rows of one micro-batch of one rank in the 2-rank layouts (for the mean-of-means check)

CASES = [
    {"name": "llama_pad", "family": "llama", "pack": False, "samples": 40, "seed": 11},
    {"name": "llama_pack", "family": "llama", "pack": True, "samples": 90, "seed": 12},
    {"name": "mistral_pack_window", "family": "mistral", "pack": True, "samples": 90, "seed": 13, "window": 5},
    # Conversations (issue 41): multi-turn messages rendered with Llama 3.1's chat template and a small
    # tokenizer holding its special tokens (make_chat_cases.py), masked per assistant turn.
    {"name": "chat_pack", "family": "llama", "pack": True, "samples": 70, "seed": 14, "chat": True},
]
CHAT_TEMPLATE = "meta-llama-Llama-3.1-8B-Instruct"
WORDS = ("the of and to a in is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there would their we him been has when who will more no if out so said what up "
         "its about into than them can only other new some could time these two may then do first any my now").split()

FAILED = []


def check(cond, msg):
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        FAILED.append(msg)


def read_token_file(path):
    with open(path, "rb") as f:
        header = torch.frombuffer(bytearray(f.read(1024)), dtype=torch.int32)
        magic, count = int(header[0]), int(header[2])
        width = {20240520: 2, 20240801: 4}[magic]
        body = bytearray(f.read())
    assert len(body) == width * count
    ids = torch.frombuffer(body, dtype=torch.int16 if width == 2 else torch.int32).to(torch.int64)
    return ids & 0xFFFF if width == 2 else ids


def read_mask(path):
    with open(path, "rb") as f:
        raw = f.read()
    head = raw[:32]
    magic, version = int.from_bytes(head[0:4], "little"), int.from_bytes(head[4:8], "little")
    count, row = int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:20], "little")
    packed = int.from_bytes(head[20:24], "little")
    assert (magic, version) == (20240605, 1), (magic, version)
    bits = torch.tensor(list(raw[32:]), dtype=torch.int64)
    assert len(bits) == count
    return bits, row, bool(packed)


def write_pairs(path, n, seed):
    rng = random.Random(seed)
    pairs = []
    with open(path, "w") as f:
        for _ in range(n):
            p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
            c = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
            pairs.append((p, c))
            f.write(json.dumps({"question": p, "answer": c}) + "\n")
    return pairs


def write_chats(cdir, n, seed):
    """Conversations of 1-2 exchanges (some with a system turn) and a tokenizer folder for them; returns
    what transformers' apply_chat_template gives each (ids, and the assistant mask of make_chat_cases.py)."""
    import make_chat_cases as mcc
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(seed)
    say = lambda k: " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, k)))  # noqa: E731
    convs = []
    for _ in range(n):
        msgs = [{"role": "system", "content": say(3)}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 2)):
            msgs += [{"role": "user", "content": say(4)}, {"role": "assistant", "content": say(5)}]
        convs.append({"messages": msgs})
    source = open(os.path.join(ROOT, "tests/data/chat_templates", CHAT_TEMPLATE + ".jinja"), encoding="utf-8").read()
    model = mcc.MODELS[CHAT_TEMPLATE]
    backend = mcc.build_tokenizer(mcc.special_tokens_of(CHAT_TEMPLATE, source, model), model)
    tok_dir = os.path.join(cdir, "tokenizer")
    os.makedirs(tok_dir)
    backend.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": model["bos"], "eos_token": model["eos"], "chat_template": source}, f)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=model["bos"], eos_token=model["eos"])
    tok.chat_template = source
    with open(os.path.join(cdir, "chats.jsonl"), "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(c) + "\n")
    expected = []
    for c in convs:
        render = lambda m, agp: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=agp)  # noqa: E731
        text = render(c["messages"], False)
        ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False)
        spans, _, _ = mcc.assistant_spans(render, c["messages"], text)
        offsets = backend.encode(text, add_special_tokens=False).offsets
        expected.append((ids, mcc.token_mask(offsets, spans)))
    return expected, tok_dir, backend.get_vocab_size()


def rows_of(ids, bits, row):
    """inputs, targets (-100 where not counted), position_ids restarting per sample."""
    ids, bits = ids.view(-1, row), bits.view(-1, row)
    starts = (bits & 2) != 0
    inputs, targets = ids[:, :-1], torch.where((bits[:, 1:] & 1) != 0, ids[:, 1:], -100)
    seg = starts[:, :-1].cumsum(-1)
    positions = torch.zeros_like(inputs)
    for r in range(inputs.shape[0]):
        begin = 0
        for j in range(inputs.shape[1]):
            if starts[r, j]:
                begin = j
            positions[r, j] = j - begin
    return inputs, targets, positions, seg


def adamw(params):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                             lr=LR, betas=BETAS, eps=EPS)


def train(params, loss_of, inputs, targets, positions, packed):
    """STEPS steps over global batches of GLOBAL rows; returns losses, grad norms, micro means."""
    opt = adamw(list(params))
    losses, norms, mean_of_means = [], [], None
    for s in range(STEPS):
        rows = slice(GLOBAL * s, GLOBAL * (s + 1))
        x, y = inputs[rows], targets[rows]
        pos = positions[rows] if packed else None
        n = int((y != -100).sum())
        opt.zero_grad()
        summed = loss_of(x, y, pos)
        loss = summed / n
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params), CLIP)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
        if s == 0:
            with torch.no_grad():
                means = []
                for m in range(GLOBAL // MICRO_ROWS):
                    part = slice(m * MICRO_ROWS, (m + 1) * MICRO_ROWS)
                    means.append(float(loss_of(x[part], y[part], pos[part] if packed else None)) /
                                 int((y[part] != -100).sum()))
                mean_of_means = sum(means) / len(means)
    return losses, norms, mean_of_means


def build(case, out_dir, shardlm):
    name = case["name"]
    cdir = os.path.join(out_dir, name)
    shutil.rmtree(cdir, ignore_errors=True)
    os.makedirs(cdir)
    print(f"== {name}")
    seq_len = CHAT_SEQ_LEN if case.get("chat") else SEQ_LEN
    if case.get("chat"):
        expected, tok_dir, _ = write_chats(cdir, case["samples"], case["seed"])
        prep = ["--input", os.path.join(cdir, "chats.jsonl"), "--tokenizer", tok_dir]
    else:
        pairs = write_pairs(os.path.join(cdir, "pairs.jsonl"), case["samples"], case["seed"])
        prep = ["--input", os.path.join(cdir, "pairs.jsonl"), "--tokenizer",
                os.path.join(ROOT, "data/brown/tokenizer.model"), "--prompt-field", "question", "--completion-field",
                "answer"]
    subprocess.run([shardlm, "prepare", "--sft", "--pack" if case["pack"] else "--pad", *prep,
                    "--out-dir", os.path.join(cdir, "data"), "--seq-len", str(seq_len), "--val-fraction", "0",
                    "--threads", "1"],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)
    ids = read_token_file(os.path.join(cdir, "data/train.bin"))
    bits, row, packed = read_mask(os.path.join(cdir, "data/train.bin.mask"))
    check(row == seq_len + 1 and packed == case["pack"], f"{name}: rows of {row} tokens, packed={packed}")
    if case.get("chat"):
        return train_case(case, cdir, ids, bits, row, seq_len, check_chat_rows(name, ids, bits, row, expected))
    check_pair_rows(name, ids, bits, row, pairs)
    return train_case(case, cdir, ids, bits, row, seq_len, None)


def check_chat_rows(name, ids, bits, row, expected):
    """Every sample is transformers' apply_chat_template ids with the assistant mask (first token excepted)."""
    starts = [i for i in range(len(bits)) if bits[i] & 2]
    check(len(starts) == len(expected), f"{name}: {len(starts)} samples in the mask for {len(expected)} conversations")
    ok = True
    for k, st in enumerate(starts[:len(expected)]):
        want_ids, want_mask = expected[k]
        got = ids[st:st + len(want_ids)].tolist()
        got_mask = [int(b & 1) for b in bits[st:st + len(want_ids)]]
        ok &= got == want_ids and got_mask[1:] == want_mask[1:]
    check(ok, f"{name}: every sample is apply_chat_template's ids with the assistant-turn mask")
    return True


def check_pair_rows(name, ids, bits, row, pairs):
    # The join rule, sample by sample: BOS(1) + prompt + completion + EOS(2), loss on completion + EOS.
    starts = [i for i in range(len(bits)) if bits[i] & 2]
    check(len(starts) == len(pairs), f"{name}: {len(starts)} samples in the mask for {len(pairs)} pairs")
    ok_join = True
    for k, st in enumerate(starts):
        end = min(starts[k + 1] if k + 1 < len(starts) else len(bits), (st // row + 1) * row)  # its row's end
        sample, loss_bits = ids[st:end].tolist(), [int(b & 1) for b in bits[st:end]]
        if sample[0] != 1 or 1 not in loss_bits:
            ok_join = False
            continue
        first = loss_bits.index(1)
        last = len(loss_bits) - 1 - loss_bits[::-1].index(1)  # the EOS; padding (eos ids, no loss) after it
        ok_join &= sample[last] == 2 and 2 not in sample[:last] and all(loss_bits[first:last + 1])
        ok_join &= all(t == 2 for t in sample[last + 1:])
    check(ok_join, f"{name}: every sample is BOS + prompt + completion + EOS with loss on completion + EOS, in one row")


def train_case(case, cdir, ids, bits, row, seq_len, chat):
    """Steps 3-5 of the docstring on the rows read back; returns the case's entry of cases.json."""
    name = case["name"]
    inputs, targets, positions, _ = rows_of(ids, bits, row)
    check(inputs.shape[0] >= GLOBAL * STEPS, f"{name}: {inputs.shape[0]} rows >= {GLOBAL * STEPS} (no wrap)")
    if case["pack"]:
        check(bool((positions[: GLOBAL * STEPS] == 0).sum() > GLOBAL * STEPS), f"{name}: rows pack several samples")

    # The model.
    common = dict(vocab_size=1024 if chat else 4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256 if chat else 64,
                  rms_norm_eps=1e-6, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    if case["family"] == "mistral":
        hf_cfg, cls = MistralConfig(**common, sliding_window=case["window"]), MistralForCausalLM
    else:
        hf_cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    torch.manual_seed(case["seed"])
    model = cls(hf_cfg).to(torch.float32)
    gen = torch.Generator().manual_seed(case["seed"])
    with torch.no_grad():
        for pname, p in model.named_parameters():
            x = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * x if pname.endswith("norm.weight") else 0.05 * x)
    model.save_pretrained(os.path.join(cdir, "model"))
    model = cls.from_pretrained(os.path.join(cdir, "model"), attn_implementation="eager", dtype=torch.float32)
    model.train(False)

    # transformers, float32.
    def tf_loss(x, y, pos):
        logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
        # The model's own causal-LM loss with the targets already shifted, summed (num_items_in_batch=1).
        return model.loss_function(logits, None, vocab_size=hf_cfg.vocab_size, num_items_in_batch=torch.tensor(1),
                                   shift_labels=y)

    tf_params = [p for _, p in model.named_parameters()]
    tf_losses, tf_norms, tf_mom = train(tf_params, tf_loss, inputs, targets, positions, case["pack"])
    safetensors_py.save_file(OrderedDict((k, p.detach().contiguous()) for k, p in model.named_parameters()),
                             os.path.join(cdir, "final_fp32.safetensors"))

    # hf_llama, float64, from the saved files.
    cfg = hf_llama.LlamaConfig.from_json_file(os.path.join(cdir, "model/config.json"))
    on_disk, _ = safetensors_py.load_file(os.path.join(cdir, "model/model.safetensors"))
    leaves = OrderedDict((k, on_disk[k].to(torch.float64).clone().requires_grad_(True)) for k in hf_llama.param_shapes(cfg))

    def ref_loss(x, y, pos):
        logits = hf_llama.forward(leaves, cfg, x, position_ids=pos)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum")

    ref_losses, ref_norms, ref_mom = train(list(leaves.values()), ref_loss, inputs, targets, positions, case["pack"])
    safetensors_py.save_file(OrderedDict((k, v.detach().contiguous()) for k, v in leaves.items()),
                             os.path.join(cdir, "final_fp64.safetensors"))
    worst = worst_of(*(abs(a - b) / abs(b) for a, b in zip(tf_losses, ref_losses)))
    check(worst < 1e-5, f"{name}: transformers fp32 losses {tf_losses} within 1e-5 of hf_llama fp64 (worst {worst:.1e})")
    gap = abs(ref_mom - ref_losses[0]) / ref_losses[0]
    check(gap > 1e-3, f"{name}: step 1's global-batch mean {ref_losses[0]:.6f} differs from the mean of the "
          f"micro-batch means {ref_mom:.6f} (relative {gap:.1e})")
    return {"name": name, "pack": case["pack"], "seq_len": seq_len, "steps": STEPS, "lr": LR,
            "fp32_losses": tf_losses, "fp32_grad_norms": tf_norms, "fp64_losses": ref_losses,
            "fp64_grad_norms": ref_norms, "mean_of_micro_means_step1": ref_mom}


def main():
    out_dir, shardlm = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)
    cases = [build(c, out_dir, shardlm) for c in CASES]
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    print(f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
