"""`shardlm prepare` and `shardlm generate` with a Hugging Face tokenizer.json: prepare writes the ids
the pinned `tokenizers` gives (encode with its special tokens, then the eos id, as src/data/prep/prepare.h
states) for the Llama 3 and Llama 2 layouts and the public GPT-2 and Qwen2 tokenizers, and generate
runs a tiny Llama with a tokenizer.json."""
import json
import lzma
import os
import unittest

from common import ROOT, main_args, read_llmc, run, tmpdir

import make_tokenizer_cases as cases  # tests/reference, on sys.path through common
from tokenizers import Tokenizer

DOCS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "I'M sure you're right, don't you think? It's O'Neil's.",
    "Café, naïve, e\u0301 non-NFC, 日本語のテキスト, العربية, עברית, हिन्दी",
    "Emoji 😀 👨‍👩‍👧‍👦 and digits 12345678901234567890",
    "hi<|endoftext|>there and <|end_of_text|> inside",
    "    leading spaces and\ttabs   trailing   ",
    "def f(x): return x ** 2  # code",
    "the last document, held out",
]


def eos_of(tok, d):
    cfg = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(cfg):
        eos = json.load(open(cfg))["eos_token"]
        return tok.token_to_id(eos if isinstance(eos, str) else eos["content"])
    for name in ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>"):
        if tok.token_to_id(name) is not None:
            return tok.token_to_id(name)
    raise AssertionError("no eos")


class TokenizerJson(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tmpdir("tokjson")
        cls.dirs = {}
        cls.dirs["llama3"] = os.path.join(cls.root, cls.make(cases.llama3(), "llama3"))
        cls.dirs["llama2"] = os.path.join(cls.root, cls.make(cases.llama2_legacy(), "llama2"))
        with lzma.open(os.path.join(ROOT, "tests", "data", "tokenizers", "gpt2", "tokenizer.json.xz"), "rt",
                       encoding="utf-8") as f:
            gpt2 = json.load(f)
        cfg = open(os.path.join(ROOT, "tests", "data", "tokenizers", "gpt2", "tokenizer_config.json"), "rb").read()
        cls.dirs["gpt2"] = os.path.join(cls.root, cls.make(gpt2, "gpt2", [("tokenizer_config.json", cfg)]))
        qdir = os.path.join(ROOT, "tests", "data", "tokenizers", "qwen2")
        with lzma.open(os.path.join(qdir, "vocab.json.xz"), "rt", encoding="utf-8") as f:
            vocab = json.load(f)
        with lzma.open(os.path.join(qdir, "merges.txt.xz"), "rt", encoding="utf-8", newline="") as f:
            merges = f.read()
        qcfg = open(os.path.join(qdir, "tokenizer_config.json"), "rb").read()
        # 151646 ids: prepare writes 32-bit token files
        cls.dirs["qwen2"] = os.path.join(cls.root, cls.make(cases.qwen2_from_parts(vocab, merges, json.loads(qcfg)), "qwen2",
                                                            [("tokenizer_config.json", qcfg)]))
        cls.text = os.path.join(cls.root, "docs.txt")
        with open(cls.text, "w", encoding="utf-8", newline="") as f:
            f.write("".join(d + "\n" for d in DOCS))

    @classmethod
    def make(cls, spec, name, extra=()):
        # write_case also writes golden cases.json; only the tokenizer.json is used here
        return cases.write_case(cls.root, name, name, spec, extra)

    def test_prepare_writes_the_ids_of_tokenizers(self):
        for name, d in self.dirs.items():
            with self.subTest(name):
                path = os.path.join(d, "tokenizer.json")
                tok = Tokenizer.from_file(path)
                eos = eos_of(tok, d)
                want = []
                for doc in DOCS:
                    ids = tok.encode(doc).ids
                    want.append(ids if ids and ids[-1] == eos else ids + [eos])
                out = os.path.join(self.root, "out_" + name)
                code, so, se, _ = run(["prepare", "--input", self.text, "--tokenizer", path, "--out-dir", out,
                                       "--val-fraction", "0.25"], timeout=300)
                self.assertEqual(code, 0, so + se)
                n_val = 2  # max(1, llround(0.25 * 8))
                self.assertEqual(read_llmc(os.path.join(out, "train.bin"))[2], sum(want[:-n_val], []))
                self.assertEqual(read_llmc(os.path.join(out, "val.bin"))[2], sum(want[-n_val:], []))

    def test_generate_runs_a_tiny_llama_with_the_tokenizer_json(self):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        path = os.path.join(self.dirs["llama3"], "tokenizer.json")
        vocab = Tokenizer.from_file(path).get_vocab_size(with_added_tokens=True)
        torch.manual_seed(0)
        model_dir = os.path.join(self.root, "tiny_model")
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        LlamaForCausalLM(cfg).save_pretrained(model_dir)
        prompt = "Hello world, café 日本"
        code, out, err, _ = run(["generate", "--model", model_dir, "--tokenizer", path, "--prompt", prompt,
                                 "--max-new-tokens", "6", "--temperature", "0"], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertTrue(out.startswith(prompt + " "), out)
        # A model smaller than the tokenizer's id space is refused, naming both sizes.
        small_dir = os.path.join(self.root, "small_model")
        cfg.vocab_size = vocab - 10
        LlamaForCausalLM(cfg).save_pretrained(small_dir)
        code, out, err, _ = run(["generate", "--model", small_dir, "--tokenizer", path, "--prompt", prompt,
                                 "--max-new-tokens", "2"], timeout=300)
        self.assertNotEqual(code, 0)
        self.assertIn(str(vocab), out + err)

    def test_unsupported_tokenizer_json_is_refused_by_prepare(self):
        spec = json.load(open(os.path.join(self.dirs["llama2"], "tokenizer.json"), encoding="utf-8"))
        spec["normalizer"] = {"type": "Lowercase"}
        bad = os.path.join(self.root, "bad.json")
        with open(bad, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        code, out, err, _ = run(["prepare", "--input", self.text, "--tokenizer", bad, "--out-dir",
                                 os.path.join(self.root, "out_bad")], timeout=120)
        self.assertNotEqual(code, 0)
        self.assertIn("normalizer Lowercase", out + err)
        self.assertIn(bad, out + err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
