"""`shardlm prepare` from the command line as users run it on JSON-lines corpora: gzipped inputs and
globs, a bad line named by file and line (nothing written) or skipped and counted, --val-fraction 0, and
shards that the trainer reads through a pattern with the same loss trajectory as one file; fine-tuning
data (--sft) in shards of whole rows, each with its mask, and --train-tokenizer refused with it."""
import gzip
import json
import os
import resource
import unittest

from common import ROOT, main_args, read_bytes, read_metrics, run, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
MODEL = os.path.join(ROOT, "data", "brown", "tokenizer.model")
SENTENCES = [
    "The Fulton County Grand Jury said Friday an investigation of recent primary elections produced no evidence.",
    "The jury further said in term-end presentments that the City Executive Committee deserves praise.",
    "Merger proposed: the jury said it believes these two offices should be combined to achieve efficiency.",
    "It urged that the city take steps to remedy this problem and to have these laws studied and revised.",
]


def write_corpus(folder, documents=120):
    """Two gzipped JSON-lines files of `documents` documents in all; returns the glob naming them."""
    for part in range(2):
        with gzip.open(os.path.join(folder, f"part{part}.jsonl.gz"), "wt", encoding="utf-8") as f:
            for i in range(part, documents, 2):
                f.write(json.dumps({"id": i, "text": f"{i}: {SENTENCES[i % 4]} {SENTENCES[(i + 1) % 4]}"}) + "\n")
    return os.path.join(folder, "part*.jsonl.gz")


def prepare(*args, **kw):
    return run(["prepare", "--tokenizer", MODEL, *args], timeout=300, **kw)


class PrepareCli(unittest.TestCase):
    def test_bad_line_is_named_and_nothing_is_written_or_skipped_and_counted(self):
        d = tmpdir("prep_bad")
        with open(os.path.join(d, "corpus.jsonl"), "w") as f:
            f.write(json.dumps({"text": "fine"}) + "\n" + '{"text": "cut off\n' + json.dumps({"text": "also fine"}) + "\n")
        out = os.path.join(d, "out")
        code, stdout, err, _ = prepare("--input", os.path.join(d, "corpus.jsonl"), "--out-dir", out)
        self.assertNotEqual(code, 0, stdout + err)
        self.assertIn("corpus.jsonl line 2: is not valid JSON", err)
        self.assertIn("--skip-bad-lines", err)
        self.assertFalse(os.path.exists(out), "nothing may be written for bad input")
        code, stdout, err, _ = prepare("--input", os.path.join(d, "corpus.jsonl"), "--out-dir", out,
                                       "--skip-bad-lines", "--val-fraction", "0")
        self.assertEqual(code, 0, stdout + err)
        self.assertIn("2 documents (2 train, 0 val)", stdout)
        self.assertIn("skipped 1 bad lines and 0 files without a document", stdout)
        self.assertIn("no validation file", stdout)
        self.assertEqual(sorted(os.listdir(out)), ["train.bin"])

    def test_shards_train_like_one_file(self):
        d = tmpdir("prep_shards")
        corpus = write_corpus(d)
        one, shards = os.path.join(d, "one"), os.path.join(d, "shards")
        code, stdout, err, _ = prepare("--input", corpus, "--out-dir", one, "--val-fraction", "0.1")
        self.assertEqual(code, 0, stdout + err)
        self.assertIn("120 documents (108 train, 12 val)", stdout)
        code, stdout, err, _ = prepare("--input", corpus, "--out-dir", shards, "--val-fraction", "0.1",
                                       "--shard-tokens", "1000", "--threads", "2")
        self.assertEqual(code, 0, stdout + err)
        files = sorted(os.listdir(shards))
        self.assertGreater(len([f for f in files if f.startswith("train_")]), 2, files)
        # The shards' ids, concatenated, are train.bin's (headers aside).
        body = b"".join(read_bytes(os.path.join(shards, f))[1024:] for f in files if f.startswith("train_"))
        self.assertEqual(body, read_bytes(os.path.join(one, "train.bin"))[1024:])

        # Many shards, few file descriptors: one shard file is open at a time.
        many = os.path.join(d, "many")
        code, stdout, err, _ = prepare("--input", corpus, "--out-dir", many, "--val-fraction", "0",
                                       "--shard-tokens", "100",
                                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48)))
        self.assertEqual(code, 0, stdout + err)
        self.assertGreater(len(os.listdir(many)), 48)

        losses = []
        for train, val in ((os.path.join(one, "train.bin"), os.path.join(one, "val.bin")),
                           (os.path.join(shards, "train_*.bin"), os.path.join(shards, "val_*.bin"))):
            out = os.path.join(d, "run" + str(len(losses)))
            code, stdout, err, _ = run(["train", "--config", TINY, "--steps=3", "--eval_interval=3", "--resume=false",
                                        f"--data.train={train}", f"--data.val={val}", f"--out_dir={out}",
                                        "--threads=1"], timeout=300)
            self.assertEqual(code, 0, stdout + err)
            losses.append([(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(out)])
        self.assertEqual(len(losses[0]), 3)
        self.assertIsNotNone(losses[0][-1][2], "step 3 evaluates on the validation split")
        self.assertEqual(losses[0], losses[1], "one file and its shards must give the same trajectory")

    def test_sft_shards_of_whole_rows_and_no_tokenizer_training(self):
        d = tmpdir("prep_sft_shards")
        pairs = os.path.join(d, "pairs.jsonl")
        with open(pairs, "w") as f:
            for i in range(40):
                f.write(json.dumps({"prompt": f"{i}: {SENTENCES[i % 4]}", "completion": SENTENCES[(i + 1) % 4]}) + "\n")
        one, shards = os.path.join(d, "one"), os.path.join(d, "shards")
        sft = ["--sft", "--input", pairs, "--seq-len", "64", "--pack", "--val-fraction", "0.1"]
        code, stdout, err, _ = prepare(*sft, "--out-dir", one, "--threads", "1")
        self.assertEqual(code, 0, stdout + err)
        # 100 tokens hold one row of 65: shards of one row, one token file and mask open at a time.
        code, stdout, err, _ = prepare(*sft, "--out-dir", shards, "--shard-tokens", "100", "--threads", "2",
                                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24)))
        self.assertEqual(code, 0, stdout + err)
        self.assertIn("shards of 1 rows = 65 tokens each (--shard-tokens 100 rounded down to whole rows)", stdout)
        self.assertIn(f'data.train = "{os.path.join(shards, "train_*.bin")}"', stdout)
        files = sorted(os.listdir(shards))
        train = [f for f in files if f.startswith("train_") and f.endswith(".bin")]
        self.assertGreater(len(train), 24, files)
        self.assertEqual([f for f in files if f.endswith(".mask")], sorted(f + ".mask" for f in files if f.endswith(".bin")))
        for split in ("train", "val"):
            body = b"".join(read_bytes(os.path.join(shards, f))[1024:] for f in files if f.startswith(split + "_")
                            and f.endswith(".bin"))
            self.assertEqual(body, read_bytes(os.path.join(one, split + ".bin"))[1024:], split)
            masks = b"".join(read_bytes(os.path.join(shards, f))[32:] for f in files if f.startswith(split + "_")
                             and f.endswith(".mask"))
            self.assertEqual(masks, read_bytes(os.path.join(one, split + ".bin.mask"))[32:], split)

        code, stdout, err, _ = prepare(*sft, "--out-dir", os.path.join(d, "trained"), "--train-tokenizer", "300")
        self.assertNotEqual(code, 0, stdout + err)
        self.assertIn("--train-tokenizer does not apply to --sft data", err)
        self.assertFalse(os.path.exists(os.path.join(d, "trained")))


if __name__ == "__main__":
    unittest.main(argv=main_args())
