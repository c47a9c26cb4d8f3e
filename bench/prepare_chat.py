"""`shardlm prepare --sft` on conversations against the Python pipeline a TRL user runs, on one core.

Why this exists: issue 41 asks that preparing a messages JSONL with `--threads 1` be at least as fast as
the same job in Python: every rendering the assistant masks need (the full conversation, and per
assistant turn the prefix with and without the generation prompt) through transformers'
apply_chat_template, then `tokenizers` encoding the full rendering (TOKENIZERS_PARALLELISM=false, so
one core) with the token offsets that place the masks. Both read the same file with the same
tokenizer.json and template, and the Python side checks its ids and masks against shardlm's rows for
the first conversations.

    /opt/shardlm/venv/bin/python bench/prepare_chat.py --mb 100 --tokenizer DIR [--repeats 5]

DIR is an HF tokenizer folder (tokenizer.json + tokenizer_config.json); the template is Qwen2.5's
(tests/data/chat_templates/). Times are wall seconds of each whole process with its peak RSS (wait4).
Each repeat runs shardlm and then Python back to back, and its ratio is Python's time over shardlm's
in that repeat, so the two sides of a ratio saw the same load; the load average (1 minute) is read
before each repeat. The result (bench/results/prepare_chat.json) gives each figure's median, min and
max over the repeats beside the per-repeat values; on shared cores the spread says how far one repeat
can be trusted.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"
WORDS = ("the of and to a in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now café 你好 🚀").split()

PEER = r'''
import json, sys, numpy as np
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
tok_dir, data, out, template = sys.argv[1:5]
backend = Tokenizer.from_file(tok_dir + "/tokenizer.json")
cfg = json.load(open(tok_dir + "/tokenizer_config.json"))
tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=cfg.get("eos_token"))
tok.chat_template = open(template, encoding="utf-8").read()
render = lambda m, agp: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=agp)
def cp(a, b):
    n = min(len(a), len(b)); i = 0
    while i < n and a[i] == b[i]: i += 1
    return i
ids_out, mask_out = [], []
with open(data, encoding="utf-8") as f:
    for line in f:
        msgs = json.loads(line)["messages"]
        full = render(msgs, False)
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        floor = cp(render(msgs[:turns[0]], True), full)
        spans = []
        for i in turns[:-1]:
            p, q = render(msgs[:i], True), render(msgs[:i + 1], False)
            if full.startswith(q) and q.startswith(p): spans.append((len(p), len(q)))
        last = turns[-1]
        lo, hi = max(cp(render(msgs[:last], True), full), floor), cp(render(msgs[:last + 1], False), full)
        if hi > lo: spans.append((lo, hi))
        enc = backend.encode(full, add_special_tokens=False)
        ids_out.append(enc.ids)
        mask_out.append([1 if any(a <= b and e <= z and b < e for a, z in spans) else 0 for b, e in enc.offsets])
np.asarray([i for ids in ids_out for i in ids], dtype=np.uint32).tofile(out)
with open(out + ".first.json", "w") as f:
    json.dump([ids_out[:50], mask_out[:50]], f)
'''


def write_data(path, mb, seed=0):
    rng = random.Random(seed)
    say = lambda lo, hi: " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    size, n = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1e6:
            msgs = [{"role": "system", "content": say(3, 20)}] if rng.random() < 0.5 else []
            for _ in range(rng.randint(1, 4)):
                msgs += [{"role": "user", "content": say(5, 80)}, {"role": "assistant", "content": say(10, 200)}]
            line = json.dumps({"messages": msgs}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            n += 1
    return n


def timed(cmd, env):
    """(wall seconds, peak RSS in MB from wait4) of cmd."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"{cmd[:3]} failed ({status}):\n{err.decode()[-2000:]}")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def spread(xs):
    """Median, min and max of a figure over the repeats."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--tokenizer", required=True, help="HF tokenizer folder (tokenizer.json, tokenizer_config.json)")
    ap.add_argument("--shardlm", default=str(REPO / "build/shardlm"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="prepare_chat_") as d:
        tok_dir = os.path.join(d, "tok")
        os.makedirs(tok_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.abspath(os.path.join(args.tokenizer, name)), os.path.join(tok_dir, name))
        data = os.path.join(d, "chat.jsonl")
        lines = write_data(data, args.mb)
        ours = [args.shardlm, "prepare", "--sft", "--input", data, "--tokenizer", tok_dir, "--chat-template",
                str(TEMPLATE), "--out-dir", os.path.join(d, "out"), "--seq-len", "8191", "--pack", "--val-fraction",
                "0", "--threads", "1"]
        peer_py = os.path.join(d, "peer.py")
        Path(peer_py).write_text(PEER)
        peer = [sys.executable, peer_py, tok_dir, data, os.path.join(d, "peer.bin"), str(TEMPLATE)]
        t_ours, t_peer, rss_ours, rss_peer, loads = [], [], [], [], []
        for r in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for cmd, t, rss in ((ours, t_ours, rss_ours), (peer, t_peer, rss_peer)):
                wall, mb = timed(cmd, env)
                t.append(wall)
                rss.append(mb)
            print(f"repeat {r + 1}/{args.repeats}: load {loads[-1]:.1f}, shardlm {t_ours[-1]:.1f} s, "
                  f"python {t_peer[-1]:.1f} s ({t_peer[-1] / t_ours[-1]:.2f}x)", flush=True)
        # The first conversations, ids and masks, as the peer computed them, against shardlm's rows.
        with open(os.path.join(d, "peer.bin.first.json")) as f:
            first_ids, first_masks = json.load(f)
        raw = open(os.path.join(d, "out/train.bin"), "rb").read()
        count, width = int.from_bytes(raw[8:12], "little"), 2 if int.from_bytes(raw[0:4], "little") == 20240520 else 4
        ids = [int.from_bytes(raw[1024 + i * width:1024 + (i + 1) * width], "little") for i in range(min(count, 200000))]
        bits = open(os.path.join(d, "out/train.bin.mask"), "rb").read()[32:32 + len(ids)]
        starts = [i for i in range(len(ids)) if bits[i] & 2]
        same = all(ids[s:s + len(w)] == w and [b & 1 for b in bits[s + 1:s + len(w)]] == m[1:]
                   for s, w, m in zip(starts, first_ids, first_masks))
    ratios = [p / o for o, p in zip(t_ours, t_peer)]
    result = {"mb": args.mb, "conversations": lines, "repeats": args.repeats,
              "summary": {"ratio_python_over_shardlm": spread(ratios), "shardlm_threads1_s": spread(t_ours),
                          "python_s": spread(t_peer), "shardlm_peak_rss_mb": spread(rss_ours),
                          "python_peak_rss_mb": spread(rss_peer), "loadavg_1min": spread(loads)},
              "per_repeat": [{"loadavg_1min": la, "shardlm_threads1_s": o, "python_s": p, "ratio": p / o,
                              "shardlm_peak_rss_mb": ro, "python_peak_rss_mb": rp}
                             for la, o, p, ro, rp in zip(loads, t_ours, t_peer, rss_ours, rss_peer)],
              "loadavg_at_end": os.getloadavg(), "cpu_count": os.cpu_count(), "first_50_identical": same,
              "template": TEMPLATE.name, "tokenizer": os.path.relpath(os.path.abspath(args.tokenizer), REPO)}
    print(json.dumps(result, indent=1))
    (REPO / "bench/results").mkdir(exist_ok=True)
    (REPO / "bench/results/prepare_chat.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
