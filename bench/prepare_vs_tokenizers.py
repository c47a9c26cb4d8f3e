"""`shardlm prepare` against Hugging Face `tokenizers` batch encoding, on the same JSONL corpus and cores.

Why this exists: issue 23 asks that shardlm's C++ tokenizer.json path turn a corpus into token ids at
least as fast per core as the Python stack users have (tokenizers' Rust encode_batch), and that
prepare's memory stay bounded whatever the corpus size. Both sides do the whole job in one process:
read the JSONL, take each line's "text", encode it with the same tokenizer.json, end each document
with eos, and write the ids (shardlm: an llm.c .bin; the peer: a numpy uint16 file, as llm.c's and
nanoGPT's prepare scripts do). The ids must be identical, and are checked.

    /opt/shardlm/venv/bin/python bench/prepare_vs_tokenizers.py            # 100 MB, 1 and 2 threads, 3 repeats
    /opt/shardlm/venv/bin/python bench/prepare_vs_tokenizers.py --quick    # 10 MB, 1 repeat
    ... --rss-mb 100 1000                                                  # peak RSS of prepare at two sizes
    ... --sft-mb 100 1000                                                  # prepare --sft: peak RSS, 1 vs all threads

Throughput is measured side by side, interleaved (shardlm, peer, shardlm, peer...), and printed as
the median ratio of each pair with its spread and the load average; the peak RSS of each process
comes from wait4's rusage.
"""

import argparse
import json
import lzma
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER = r'''
import json, sys, time, numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1]); eos = int(sys.argv[4])
out, ids, batch = open(sys.argv[3], "wb"), [], []
def flush():
    for enc in tok.encode_batch(batch):
        ids.extend(enc.ids); ids.append(eos)
    batch.clear()
with open(sys.argv[2], encoding="utf-8") as f:
    for line in f:
        if line.strip():
            batch.append(json.loads(line)["text"])
            if len(batch) == 1000: flush()
flush()
np.asarray(ids, dtype=np.uint16).tofile(out)
'''


def peak_rss(cmd, env):
    """Runs cmd and returns (wall seconds, peak RSS in bytes) from wait4."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"{cmd[0]} failed ({status}):\n{err.decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024


def make_corpus(path, megabytes, seed=0):
    """JSONL documents of 1-4 KB drawn from the Brown corpus, with multilingual lines mixed in."""
    brown = lzma.open(REPO / "data" / "brown" / "brown.txt.xz", "rt", encoding="utf-8").read().splitlines()
    brown = [line for line in brown if line.strip()]
    extra = ["Café déjà vu — naïve façade, Ångström.", "東京は日本の首都です。", "مرحبا بالعالم", "שלום עולם",
             "नमस्ते दुनिया", "👩‍👩‍👧 family 🇫🇷", "def f(x):\n    return x ** 2  # 12345678"]
    rng = random.Random(seed)
    target, written = megabytes * 1_000_000, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            parts, size = [], rng.randint(1000, 4000)
            while sum(map(len, parts)) < size:
                parts.append(rng.choice(extra) if rng.random() < 0.05 else rng.choice(brown))
            line = json.dumps({"text": " ".join(parts)}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))


def make_sft_pairs(path, megabytes, seed=0):
    """JSONL prompt/completion pairs (40-600 and 40-2000 characters) drawn from the Brown corpus."""
    brown = [line for line in lzma.open(REPO / "data" / "brown" / "brown.txt.xz", "rt", encoding="utf-8").read().splitlines()
             if line.strip() and len(line) < 400]
    rng = random.Random(seed)

    def text(n):
        parts, size = [], 0
        while size < n:
            parts.append(rng.choice(brown))
            size += len(parts[-1]) + 1
        return " ".join(parts)

    target, written = megabytes * 1_000_000, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            line = json.dumps({"prompt": text(rng.randint(40, 600)), "completion": text(rng.randint(40, 2000))}) + "\n"
            f.write(line)
            written += len(line)


def bench_sft(args, work, tokenizer):
    """prepare --sft (packed rows of 2049, --truncate) at each size: peak RSS and wall time on every core, and at
    the first size the time on 1 thread against every core, interleaved; the outputs must be byte-identical."""
    for i, mb in enumerate(args.sft_mb):
        pairs = work / f"sft_{mb}mb.jsonl"
        if not pairs.exists():
            make_sft_pairs(pairs, mb, seed=mb)
        cmd = lambda out, threads: [args.shardlm, "prepare", "--sft", "--input", str(pairs), "--tokenizer", tokenizer,
                                    "--out-dir", str(out), "--seq-len", "2048", "--pack", "--truncate", "--threads",
                                    str(threads)]
        wall, rss = peak_rss(cmd(work / f"sft_all_{mb}", 0), dict(os.environ))
        print(f"prepare --sft of {pairs.stat().st_size / 1e6:.0f} MB JSONL (every core): peak RSS {rss / 1e6:.0f} MB, "
              f"{wall:.1f} s")
        if i == 0:
            ratios = []
            for _ in range(args.repeats):
                one, _ = peak_rss(cmd(work / "sft_one", 1), dict(os.environ))
                every, _ = peak_rss(cmd(work / "sft_every", 0), dict(os.environ))
                ratios.append(one / every)
            for name in ("train.bin", "train.bin.mask", "val.bin", "val.bin.mask"):
                if (work / "sft_one" / name).read_bytes() != (work / "sft_every" / name).read_bytes():
                    sys.exit(f"prepare --sft wrote another {name} on 1 thread than on every core")
            print(f"prepare --sft, 1 thread / every core ({os.cpu_count()}) wall time: median "
                  f"{statistics.median(ratios):.2f} (per repeat {', '.join(f'{x:.2f}' for x in ratios)}), outputs identical")
        pairs.unlink()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=100, help="corpus size for the throughput comparison (MB)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to compare at")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rss-mb", type=int, nargs="*", default=[], help="corpus sizes for prepare's peak RSS (MB)")
    p.add_argument("--sft-mb", type=int, nargs="*", default=[], help="pair-file sizes for prepare --sft (MB); "
                   "skips the pretraining comparison")
    p.add_argument("--quick", action="store_true", help="10 MB, one repeat")
    p.add_argument("--shardlm", default=str(REPO / "build" / "shardlm"))
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    args = p.parse_args()
    if args.quick:
        args.mb, args.repeats = 10, 1
    work = Path(args.work or tempfile.mkdtemp(prefix="shardlm_prep_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    tok_dir = work / "gpt2"
    tok_dir.mkdir(exist_ok=True)
    src = REPO / "tests" / "data" / "tokenizers" / "gpt2"
    (tok_dir / "tokenizer.json").write_bytes(lzma.open(src / "tokenizer.json.xz").read())
    (tok_dir / "tokenizer_config.json").write_bytes((src / "tokenizer_config.json").read_bytes())
    tokenizer = str(tok_dir / "tokenizer.json")
    eos = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]["<|endoftext|>"]

    if args.sft_mb:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        bench_sft(args, work, tokenizer)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    corpus = work / f"corpus_{args.mb}mb.jsonl"
    if not corpus.exists():
        make_corpus(corpus, args.mb)
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.0f} MB), tokenizer GPT-2 (tests/data/tokenizers/gpt2)")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for threads in args.threads:
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true", OMP_NUM_THREADS="1")
        ratios, ours, theirs, tokens = [], [], [], None
        for r in range(args.repeats):
            out = work / f"out_{threads}"
            s_wall, _ = peak_rss([args.shardlm, "prepare", "--input", str(corpus), "--tokenizer", tokenizer,
                                  "--out-dir", str(out), "--val-fraction", "0", "--threads", str(threads)], env)
            peer_out = work / f"peer_{threads}.u16"
            p_wall, _ = peak_rss([sys.executable, "-c", PEER, tokenizer, str(corpus), str(peer_out), str(eos)], env)
            body = (out / "train.bin").read_bytes()[1024:]
            if body != peer_out.read_bytes():
                sys.exit("the ids differ between shardlm prepare and tokenizers: the comparison is void")
            tokens = len(body) // 2
            ours.append(tokens / s_wall / threads)
            theirs.append(tokens / p_wall / threads)
            ratios.append(ours[-1] / theirs[-1])
        print(f"{threads} thread(s), {tokens} tokens (ids identical): shardlm {statistics.median(ours):,.0f} tokens/s "
              f"per core [{min(ours):,.0f}-{max(ours):,.0f}], tokenizers {statistics.median(theirs):,.0f} "
              f"[{min(theirs):,.0f}-{max(theirs):,.0f}]; ratio shardlm/tokenizers median {statistics.median(ratios):.2f} "
              f"(per repeat {', '.join(f'{x:.2f}' for x in ratios)})")
    for mb in args.rss_mb:
        c = work / f"corpus_{mb}mb.jsonl"
        if not c.exists():
            make_corpus(c, mb, seed=mb)
        wall, rss = peak_rss([args.shardlm, "prepare", "--input", str(c), "--tokenizer", tokenizer, "--out-dir",
                              str(work / f"rss_{mb}"), "--val-fraction", "0"], dict(os.environ))
        print(f"prepare of {c.stat().st_size / 1e6:.0f} MB JSONL (every core): peak RSS {rss / 1e6:.0f} MB, {wall:.1f} s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
