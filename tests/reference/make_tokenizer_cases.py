#!/usr/bin/env python3
"""Golden token ids for shardlm's tokenizer.json implementation, made by the pinned `tokenizers`.

    /opt/shardlm/venv/bin/python tests/reference/make_tokenizer_cases.py OUT_DIR

Nothing is downloaded. OUT_DIR receives one folder per tokenizer:

  <name>/tokenizer.json   the tokenizer: built here, or from the public files of
                          tests/data/tokenizers/ (a tokenizer.json decompressed; a Llama 2
                          SentencePiece tokenizer.model, Llama 3 tiktoken tokenizer.model or Qwen2
                          vocab.json + merges.txt assembled into one, see SOURCES.md there), with
                          its tokenizer_config.json if any
  <name>/cases.json       {"what": ..., "cases": [{"text", "add_special_tokens", "ids",
                          "decode", "decode_skip"}, ...]}: ids = encode(text,
                          add_special_tokens).ids, decode = decode(ids, False), decode_skip =
                          decode(ids, True), all from `tokenizers.Tokenizer.from_file` of the
                          very file written (so the golden is what the file means, not how it
                          was built).
  index.json              the names, in order.
  unicode.json            {"classes": {property: [[first, last], ...]}}: the code points the regex
                          \p{property} (and \s) matches in tokenizers' Oniguruma, for every property
                          shardlm supports; {"normalization": [[text, NFC, NFD, NFKC, NFKD], ...]}:
                          tokenizers' normalizers on probes around every code point utf8proc
                          normalizes (see make_unicode_tables.py).

The synthetic tokenizers train a small BPE with tokenizers' own BpeTrainer on CORPUS plus
seeded random text, then assemble normalizer / pre-tokenizer / decoder / post-processor as
the public files of GPT-2, Llama 3, Qwen2, Llama 2 (legacy normalizer form and the newer
Metaspace form), Mistral and TinyLlama have them.
"""
import json
import lzma
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "tokenizers")

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "I'M sure you're right, don't you think? WE'LL see; they'd've known. It's O'Neil's.",
    "Café, naïve, résumé, coöperate, Ångström, Æsir, ß, İstanbul, ǅ, ﬁ ligature, ℌ ①",
    "e\u0301 versus \u00e9, A\u030a versus \u00c5, \u1e9b\u0323 (non-NFC input), \u0915\u094d\u0937",
    "日本語のテキストです。中文字符测试，繁體中文。한국어 텍스트입니다.",
    "العربية نص تجريبي مع أرقام ١٢٣٤ and English mixed.",
    "עברית טקסט לבדיקה, שלום עולם.",
    "हिन्दी में पाठ। संस्कृतम्। देवनागरी अंक १२३",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 ❤️ 🧑🏿‍🚀 and ZWJ\u200dinside",
    "Tabs\tand\t\ttabs, newlines\n\nand\r\nCRLF, trailing spaces   ",
    "   leading spaces and    runs     of      spaces\n\n\n",
    "def f(x):\n    return x ** 2  # comment\n\tif (a && b) { c[i] = d->e; }\n",
    "long digits 12345678901234567890 and 3.14159265358979 and 1,000,000 and ٣٤٥",
    "hi<|endoftext|>there <|endoftext|> and <s>start</s> end <|im_start|>user\nhey<|im_end|>",
    "unknown chars: \u2603 \U0001F9EC \u0fff \ue000 \U0010fffd \u2028 \u00a0 \u3000 \u180e \u0085 end",
    "MiXeD CaSe 'S 'T 'Re 'VE 'M 'LL 'D ſt \u212a",
    "URLs https://example.com/path?q=1&r=2#frag and emails a.b@c.de",
    "",
    " ",
    "\n",
    "a",
    "▁already▁has▁metaspace ▁ and ▁▁ double",
    "[MASK] single word test: hello world, hello worlds, say hello world!",
    "lstrip   [MASK]   rstrip and [MASK]x and x[MASK]",
]

FRAGMENTS = ["the", "The", " of", "and", "ing", "tion", " ", "  ", "\n", "\t", "'s", "'LL", "don't",
             "42", "2024", "1234567", "é", "e\u0301", "日本", "語", "한", "ع", "ש", "ह", "😀", "👨‍👩‍👧",
             "<|endoftext|>", "<s>", "</s>", "[MASK]", "hello world", "...", "—", "«", "»", "$", "€",
             "Ωmega", "straße", "ΣΊΣΥΦΟΣ", "ﬀ", "①", "\u00a0", "\u3000", "ab" * 20, "x" * 300,
             "9" * 40, "!?", "(", ")", "{", "}", "<", ">", "|"]


def random_texts(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(FRAGMENTS))
            elif r < 0.85:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x24F),
                                             rng.randint(0x370, 0x6FF), rng.randint(0x900, 0x97F),
                                             rng.randint(0x3040, 0x30FF), rng.randint(0x4E00, 0x4FFF),
                                             rng.randint(0x1F300, 0x1F64F), rng.randint(0x2000, 0x206F)])))
            else:
                parts.append(" " * rng.randint(1, 4))
        out.append("".join(parts))
    return out


TRAIN_TEXT = CORPUS + random_texts(400, 1) + [
    "the quick brown fox " * 5, "tokenization is the process of splitting text into tokens " * 3,
    "日本語 中文 한국어 العربية עברית हिन्दी " * 3]
# Texts for the real Llama 3 and Mistral files, not in CORPUS (so the synthetic tokenizers train on the
# same text as before): their special-token text, and words that Llama 3's vocabulary holds whole but
# its merges do not reach (" việc" is one id with ignore_merges, three without), which tell
# ignore_merges apart on the real file.
EXTRA_TEXTS = [
    "Tiếng Việt: nhiều việc hợp điều hiểu; Türkçe: değiş oluştur ulaş; русский: характер даже "
    "культу; فارسی: ایران اطلاعات; .:.:.:.:.:.:.:.:",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "text<|end_of_text|> <|reserved_special_token_3|>x<|reserved_special_token_250|> <|reserved_special_token_251|>",
    "<s>[INST] What is 2+2? [/INST] 4</s>[INST]again[/INST] [TOOL_CALLS] [control_8] [AVAILABLE_TOOLS]",
]
CASE_TEXTS = CORPUS + random_texts(150, 2) + ["word " * 200, "ab" * 700, "😀" * 50] + EXTRA_TEXTS

BYTE_TOKENS = ["<0x%02X>" % b for b in range(256)]


def trained_bpe(tok, vocab_size, special, initial_alphabet=(), limit_alphabet=None, **bpe):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=list(initial_alphabet),
                                  **({"limit_alphabet": limit_alphabet} if limit_alphabet else {}))
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    return tok


def gpt2(add_prefix_space):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trained_bpe(tok, 1200, ["<|endoftext|>"], pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello world", single_word=True, normalized=True)])
    return tok


def llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trained_bpe(tok, 1500, [], pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    return tok


def qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trained_bpe(tok, 1300, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], pre_tokenizers.ByteLevel.alphabet())
    # a normalized, non-special added token whose NFC form differs from its content
    tok.add_tokens([AddedToken("cafe\u0301", normalized=True)])
    return tok


def with_byte_vocab(tok, front=("<unk>", "<s>", "</s>"), byte_tokens=True):
    """The Llama/Mistral layout: <unk> <s> </s> then <0x00>..<0xFF> in the model vocabulary."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    order = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in front and t not in BYTE_TOKENS]
    new = list(front) + (BYTE_TOKENS if byte_tokens else []) + order
    spec["model"]["vocab"] = {t: i for i, t in enumerate(new)}
    spec["added_tokens"] = [dict(a, id=new.index(a["content"])) for a in spec["added_tokens"] if a["content"] in front]
    return spec


def llama2_legacy(byte_fallback=True):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=byte_fallback))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained_bpe(tok, 900, [AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")],
                limit_alphabet=120)
    spec = with_byte_vocab(tok, byte_tokens=byte_fallback)
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return spec


def metaspace(prepend_scheme, split, metaspace_decoder):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=split)
    trained_bpe(tok, 900, [AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")],
                limit_alphabet=120)
    spec = with_byte_vocab(tok)
    if metaspace_decoder:
        spec["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme, "split": split}
    else:
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return spec


def spm_pieces(blob):
    """(piece, score, type) of a SentencePiece ModelProto: field 1 holds the pieces, each a message
    with piece = 1 (string), score = 2 (float), type = 3 (1 normal, 2 unknown, 3 control,
    4 user-defined, 6 byte). A minimal protobuf reader, so no protobuf package is needed."""
    import struct

    def varint(b, i):
        v = shift = 0
        while True:
            c = b[i]
            i += 1
            v |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return v, i

    def fields(b):
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            num, wire = key >> 3, key & 7
            if wire == 0:
                val, i = varint(b, i)
            elif wire == 1:
                val, i = b[i:i + 8], i + 8
            elif wire == 2:
                n, i = varint(b, i)
                val, i = b[i:i + n], i + n
            elif wire == 5:
                val, i = b[i:i + 4], i + 4
            else:
                raise ValueError(f"wire type {wire}")
            yield num, val

    out = []
    for num, val in fields(blob):
        if num != 1:
            continue
        piece, score, kind = "", 0.0, 1
        for n, v in fields(val):
            if n == 1:
                piece = v.decode("utf-8")
            elif n == 2:
                score = struct.unpack("<f", v)[0]
            elif n == 3:
                kind = v
        out.append((piece, score, kind))
    return out


def from_spm(blob, layout):
    """A BPE SentencePiece model as transformers' LlamaConverter turns it into a tokenizer.json:
    vocab = pieces by id, merges = every split of a piece into two pieces, ordered by the merged
    piece's score (highest first; within a piece by the ids of its halves), as
    SentencePieceExtractor does. layout "legacy": Prepend/Replace normalizers (TinyLlama, Llama 2
    files); "metaspace": Metaspace(prepend_scheme first, split false) pre-tokenizer (what
    legacy=False conversions write, as newer Llama/Mistral files have)."""
    pieces = spm_pieces(blob)
    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    scores = {p: s for p, s, _ in pieces}
    merges = []
    for merge, score in scores.items():
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2], reverse=True)
    unk = next(p for p, _, k in pieces if k == 2)
    tok = Tokenizer(models.BPE(vocab, [(a, b) for a, b, _ in merges], unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True) for p, _, k in pieces if k in (2, 3)])
    if layout == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    # as LlamaTokenizerFast.update_post_processor writes it (the Hub files' template)
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


LLAMA3_SPECIAL = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
                  + [f"<|reserved_special_token_{i}|>" for i in range(5, 256 - 5)])


def is_tiktoken(blob):
    """A tiktoken rank file ("<base64 token> <rank>" lines), not a SentencePiece ModelProto."""
    first = blob.split(b"\n", 1)[0].split()
    return len(first) == 2 and first[1].isdigit() and all(c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                          b"0123456789+/=" for c in first[0])


def llama3_from_tiktoken(blob):
    """Llama 3's Hub tokenizer.json, rebuilt from Meta's tiktoken rank file with the pinned
    transformers' own TikTokenConverter (byte-level BPE: vocab = the ranks through the ByteLevel
    byte-to-unicode table, merges recovered from the ranks, ignore_merges; Split(Llama 3's regex,
    isolated) + ByteLevel(no prefix space, no regex); ByteLevel decoder), then what the Llama 3
    conversion (transformers' convert_llama_weights_to_hf.py, Llama3Converter) adds: the 256
    special tokens 128000-128255 with Llama 3's names, and the post-processor of the Hub's
    Meta-Llama-3 files, Sequence[ByteLevel(add_prefix_space, no trim_offsets), TemplateProcessing
    "<|begin_of_text|> $A"]. The rank file is parsed here (base64 + rank, as tiktoken's
    load_tiktoken_bpe does) so that the tiktoken package is not needed."""
    import base64

    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = {}
    for line in blob.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks are not 0..n-1")

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_url):
            return ranks

    tok = Converter(None, pattern=LLAMA3_RE, extra_special_tokens=LLAMA3_SPECIAL).converted()
    if tok.token_to_id(LLAMA3_SPECIAL[0]) != len(ranks) or tok.get_vocab_size() != len(ranks) + len(LLAMA3_SPECIAL):
        raise ValueError("Llama 3 special tokens are not at 128000-128255")
    bos = LLAMA3_SPECIAL[0]
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, tok.token_to_id(bos))])])
    return tok


def qwen2_from_parts(vocab, merges_txt, config):
    """Qwen2's tokenizer.json as its Hub files have it, around a vocab.json and merges.txt: NFC,
    Split(QWEN2_RE, isolated) + ByteLevel(no prefix space, no regex), BPE without unk or byte
    fallback, ByteLevel post-processor and decoder; the added tokens of tokenizer_config.json's
    added_tokens_decoder, in id order."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    # lines as Rust's BufRead::lines (what BPE.from_file reads merges.txt with) splits them: "\n" or "\r\n"
    lines = [line[:-1] if line.endswith("\r") else line for line in merges_txt.split("\n")]
    merges = [line for line in lines if line and not line.startswith("#version")]
    added = [dict(id=int(i), **t) for i, t in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_RE}, "behavior": "Isolated", "invert": False}, byte_level]},
            "post_processor": byte_level, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def write_case(out_dir, name, what, spec_or_tok, extra_files=()):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    if isinstance(spec_or_tok, Tokenizer):
        spec_or_tok.save(path)
    else:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec_or_tok, f, ensure_ascii=False)
    for fname, content in extra_files:
        with open(os.path.join(d, fname), "wb") as f:
            f.write(content)
    tok = Tokenizer.from_file(path)
    cases = []
    for text in CASE_TEXTS:
        for add in (True, False):
            ids = tok.encode(text, add_special_tokens=add).ids
            cases.append({"text": text, "add_special_tokens": add, "ids": ids,
                          "decode": tok.decode(ids, skip_special_tokens=False),
                          "decode_skip": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"what": what, "vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": cases},
                  f, ensure_ascii=False)
    return name


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = []
    names.append(write_case(out, "gpt2_synth", "GPT-2 layout, trained here", gpt2(False)))
    names.append(write_case(out, "gpt2_prefix_space", "GPT-2 layout with add_prefix_space", gpt2(True)))
    names.append(write_case(out, "llama3_synth", "Llama 3 layout (Split + ByteLevel, ignore_merges, BOS template)", llama3()))
    names.append(write_case(out, "qwen2_synth", "Qwen2 layout (NFC + Split + ByteLevel)", qwen2()))
    names.append(write_case(out, "llama2_legacy", "Llama 2 / TinyLlama legacy normalizer layout, byte_fallback", llama2_legacy()))
    names.append(write_case(out, "llama2_legacy_unk", "Llama 2 legacy layout without byte tokens (fused <unk>)", llama2_legacy(False)))
    for scheme in ("first", "always", "never"):
        for split in (False, True):
            names.append(write_case(out, f"metaspace_{scheme}_{'split' if split else 'nosplit'}",
                                    f"Mistral/Llama Metaspace layout, prepend_scheme {scheme}, split {split}",
                                    metaspace(scheme, split, metaspace_decoder=split)))
    # Real public files (tests/data/tokenizers/SOURCES.md says where each comes from).
    for name in sorted(os.listdir(DATA)):
        src = os.path.join(DATA, name)
        if not os.path.isdir(src):
            continue
        if os.path.exists(os.path.join(src, "tokenizer.model.xz")):
            with lzma.open(os.path.join(src, "tokenizer.model.xz"), "rb") as f:
                blob = f.read()
            if is_tiktoken(blob):
                names.append(write_case(out, "real_" + name, f"public {name} tiktoken tokenizer.model, "
                                        "converted as transformers' Llama3Converter does", llama3_from_tiktoken(blob)))
                continue
            for layout in ("legacy", "metaspace"):
                names.append(write_case(out, f"real_{name}_{layout}", f"public {name} tokenizer.model, {layout} layout",
                                        from_spm(blob, layout)))
            continue
        # the other files beside it (tokenizer_config.json), decompressed when stored as .xz
        extra = [(fn, open(os.path.join(src, fn), "rb").read()) for fn in sorted(os.listdir(src))
                 if not fn.endswith(".xz")]
        extra += [(fn[:-3], lzma.open(os.path.join(src, fn), "rb").read()) for fn in sorted(os.listdir(src))
                  if fn.endswith(".xz") and fn[:-3] not in ("tokenizer.json", "vocab.json", "merges.txt")]
        if os.path.exists(os.path.join(src, "vocab.json.xz")):
            with lzma.open(os.path.join(src, "vocab.json.xz"), "rt", encoding="utf-8") as f:
                vocab = json.load(f)
            with lzma.open(os.path.join(src, "merges.txt.xz"), "rt", encoding="utf-8", newline="") as f:
                merges_txt = f.read()
            config = json.loads(dict(extra)["tokenizer_config.json"])
            names.append(write_case(out, "real_" + name, f"public {name} vocab.json + merges.txt",
                                    qwen2_from_parts(vocab, merges_txt, config), extra))
            continue
        with lzma.open(os.path.join(src, "tokenizer.json.xz"), "rt", encoding="utf-8") as f:
            spec = json.load(f)
        names.append(write_case(out, "real_" + name, f"public file {name}", spec, extra))
    import make_unicode_tables as ut
    classes = {p: ut.ranges(ut.onig_set("\\p{" + p + "}")) for p in ut.PROPS if p != "Mn"}
    classes["s"] = ut.ranges(ut.onig_set("\\s"))
    forms = [getattr(normalizers, f)() for f in ("NFC", "NFD", "NFKC", "NFKD")]
    norm = []
    for c in ut.normalization_candidates():
        for text in (chr(c), "e" + chr(c) + "\u0327", "a" + chr(c) + "\u0301", "\u0301" + chr(c) + "\u0316"):
            norm.append([text] + [f.normalize_str(text) for f in forms])
    with open(os.path.join(out, "unicode.json"), "w", encoding="utf-8") as f:
        json.dump({"classes": classes, "normalization": norm}, f, ensure_ascii=False)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "names": names}, f)
    print(f"wrote {len(names)} tokenizers with {len(CASE_TEXTS) * 2} cases each to {out}")


if __name__ == "__main__":
    main()
