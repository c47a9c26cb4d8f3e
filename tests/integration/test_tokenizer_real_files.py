"""`shardlm prepare` and `shardlm generate` with the real Llama 3 and Mistral 7B v0.3 tokenizers
(tests/data/tokenizers/SOURCES.md; the tokenizer.json files are the ones make_tokenizer_cases.py
builds for the parity test): prepare writes the ids of the pinned `tokenizers` plus the eos id, as
32-bit ids (llm.c version 7) for Llama 3's 128256-id vocabulary and 16-bit ids (version 1) for
Mistral's 32768, and generate runs a tiny Llama of Llama 3's vocabulary with the Llama 3 file."""
import json
import lzma
import os
import unittest

from common import ROOT, main_args, read_llmc, run, tmpdir

import make_tokenizer_cases as cases  # tests/reference, on sys.path through common
from tokenizers import Tokenizer

DATA = os.path.join(ROOT, "tests", "data", "tokenizers")
DOCS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Café, naïve, e\u0301 non-NFC, 日本語のテキスト, العربية, עברית, हिन्दी, Tiếng Việt: nhiều việc",
    "Emoji 😀 👨‍👩‍👧‍👦 and digits 12345678901234567890",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|> Hi<|eot_id|> [INST] hey [/INST]",
    "a document that ends in Mistral's eos</s>",
    "    leading spaces and\ttabs   trailing   ",
    "def f(x): return x ** 2  # code",
    "the last two documents, held out",
    "the validation set",
]


class RealTokenizerFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tmpdir("tokreal")
        cls.paths = {}
        with lzma.open(os.path.join(DATA, "llama3", "tokenizer.model.xz"), "rb") as f:
            llama3 = cases.llama3_from_tiktoken(f.read())
        os.makedirs(os.path.join(cls.root, "llama3"))
        cls.paths["llama3"] = os.path.join(cls.root, "llama3", "tokenizer.json")
        llama3.save(cls.paths["llama3"])
        os.makedirs(os.path.join(cls.root, "mistral_v03"))
        cls.paths["mistral_v03"] = os.path.join(cls.root, "mistral_v03", "tokenizer.json")
        with lzma.open(os.path.join(DATA, "mistral_v03", "tokenizer.json.xz"), "rb") as f, \
                open(cls.paths["mistral_v03"], "wb") as g:
            g.write(f.read())
        cls.text = os.path.join(cls.root, "docs.txt")
        with open(cls.text, "w", encoding="utf-8", newline="") as f:
            f.write("".join(d + "\n" for d in DOCS))

    def test_prepare_writes_the_ids_of_tokenizers_in_the_width_the_vocabulary_needs(self):
        # name: (vocabulary, eos id, llm.c magic and version)
        expect = {"llama3": (128256, 128001, 20240801, 7), "mistral_v03": (32768, 2, 20240520, 1)}
        for name, path in self.paths.items():
            with self.subTest(name):
                vocab, eos, magic, version = expect[name]
                tok = Tokenizer.from_file(path)
                self.assertEqual(tok.get_vocab_size(with_added_tokens=True), vocab)
                want = []
                for doc in DOCS:  # prepare.h: the encoding, then eos unless it already ends with it
                    ids = tok.encode(doc).ids
                    want.append(ids if ids[-1] == eos else ids + [eos])
                out = os.path.join(self.root, "out_" + name)
                code, so, se, _ = run(["prepare", "--input", self.text, "--tokenizer", path, "--out-dir", out,
                                       "--val-fraction", "0.25"], timeout=300)
                self.assertEqual(code, 0, so + se)
                n_val = 2  # max(1, llround(0.25 * 9))
                got_magic, got_version, train = read_llmc(os.path.join(out, "train.bin"))
                self.assertEqual((got_magic, got_version), (magic, version))
                self.assertEqual(train, sum(want[:-n_val], []))
                self.assertEqual(read_llmc(os.path.join(out, "val.bin"))[2], sum(want[-n_val:], []))
                if name == "llama3":
                    self.assertEqual(train[0], 128000)  # <|begin_of_text|>, past 16 bits
                    self.assertIn(128009, train)        # <|eot_id|> in the text is the special token

    def test_prepare_with_qwen2s_tokenizer_json_alone_ends_documents_with_endoftext(self):
        """Without tokenizer_config.json beside it, Qwen2's documents end with its special
        <|endoftext|> (151643), not the plain BPE token "</s>" (128247) found by name; prepare says
        which eos it used; a tokenizer with no eos of any kind is refused naming --eos-token."""
        src = os.path.join(DATA, "qwen2")
        with lzma.open(os.path.join(src, "vocab.json.xz"), "rt", encoding="utf-8") as f:
            vocab = json.load(f)
        with lzma.open(os.path.join(src, "merges.txt.xz"), "rt", encoding="utf-8", newline="") as f:
            merges = f.read()
        with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        alone = os.path.join(self.root, "qwen2_alone")
        os.makedirs(alone)
        spec = cases.qwen2_from_parts(vocab, merges, config)
        with open(os.path.join(alone, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        self.assertEqual(vocab["</s>"], 128247)  # the name the old rule chose: an ordinary BPE token
        out = os.path.join(self.root, "out_qwen2_alone")
        code, so, se, _ = run(["prepare", "--input", self.text, "--tokenizer", alone, "--out-dir", out,
                               "--val-fraction", "0"], timeout=300)
        self.assertEqual(code, 0, so + se)
        self.assertIn('eos ending each document: id 151643 "<|endoftext|>"', so)
        train = read_llmc(os.path.join(out, "train.bin"))[2]
        self.assertEqual(train.count(151643), len(DOCS))
        self.assertNotIn(128247, train)
        # --eos-token chooses another; a tokenizer without any eos is refused naming the flag.
        code, so, se, _ = run(["prepare", "--input", self.text, "--tokenizer", alone, "--out-dir", out + "2",
                               "--val-fraction", "0", "--eos-token", "<|im_end|>"], timeout=300)
        self.assertEqual(code, 0, so + se)
        self.assertIn('id 151645 "<|im_end|>" (--eos-token)', so)
        bare = os.path.join(self.root, "qwen2_no_eos")
        os.makedirs(bare)
        for t in spec["added_tokens"]:  # <|endoftext|> no longer special: no conventional name is
            t["special"] = t["special"] and t["content"] != "<|endoftext|>"
        with open(os.path.join(bare, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        code, so, se, _ = run(["prepare", "--input", self.text, "--tokenizer", bare, "--out-dir", out + "3",
                               "--val-fraction", "0"], timeout=300)
        self.assertNotEqual(code, 0, so + se)
        self.assertIn("--eos-token", se)

    def test_generate_runs_a_tiny_llama_with_llama3s_vocabulary(self):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        model_dir = os.path.join(self.root, "tiny_model")
        cfg = LlamaConfig(vocab_size=128256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)
        LlamaForCausalLM(cfg).save_pretrained(model_dir)
        prompt = "Hello world, café 日本 việc"
        code, out, err, _ = run(["generate", "--model", model_dir, "--tokenizer", self.paths["llama3"],
                                 "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0"], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertTrue(out.startswith(prompt), out)
        self.assertGreater(len(out.strip()), len(prompt), out)


if __name__ == "__main__":
    unittest.main(argv=main_args())
