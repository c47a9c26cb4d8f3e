"""Several training datasets blended by weight (data.blend, Megatron's blending: src/data/loader/blend.h),
the background prefetch (data.prefetch) and resumes of blended and fine-tuning data: a run stopped
and resumed reproduces the uninterrupted one bit for bit (ZeRO-3, shuffled); the prefetch depth
changes nothing in the numbers; a changed mix on resume is said in the log; bad blends are refused
naming the problem, before anything is written. The order itself (Megatron's indices, rows whole
from the named dataset, world independence) is unit-tested in tests/unit/data/test_blend.cpp."""
import json
import lzma
import os
import random
import subprocess
import unittest

from common import ROOT, SHARDLM, ENV, main_args, read_bytes, read_metrics, run, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--nproc", "2", "--data.val=", "--log_interval=100"]
BLEND = ["--data.train=", '--data.blend=[0.7, "data/brown/train.bin", "0.3", "data/brown/val.bin"]',
         "--data.shuffle=true", "--zero_optimization.stage=3"]


def prepare_sft(out_dir):
    """Fine-tuning rows (packed, seq_len 32, the run's) of prompt/completion pairs cut from Brown text."""
    with lzma.open(os.path.join(ROOT, "data", "brown", "brown.txt.xz"), "rt", encoding="utf-8") as f:
        words = f.read(200000).split()
    rng = random.Random(5)
    pairs = os.path.join(out_dir, "pairs.jsonl")
    with open(pairs, "w") as f:
        for _ in range(160):
            start = rng.randrange(len(words) - 20)
            p, c = rng.randint(1, 4), rng.randint(1, 5)
            f.write(json.dumps({"prompt": " ".join(words[start:start + p]),
                                "completion": " ".join(words[start + p:start + p + c])}) + "\n")
    p = subprocess.run([SHARDLM, "prepare", "--sft", "--pack", "--input", pairs, "--tokenizer",
                        os.path.join(ROOT, "data", "brown", "tokenizer.model"), "--out-dir", os.path.join(out_dir, "sft"),
                        "--seq-len", "32", "--val-fraction", "0", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return os.path.join(out_dir, "sft", "train.bin")


class DataBlend(unittest.TestCase):
    def train(self, out_dir, steps, *extra):
        code, out, err, _ = run(BASE + [f"--steps={steps}", f"--out_dir={out_dir}", *extra])
        self.assertEqual(code, 0, out + err)
        return out + err

    def expect_resume_bit_identical(self, name, *flags):
        straight, d = tmpdir(name + "_straight"), tmpdir(name + "_resumed")
        self.train(straight, 6, *flags)
        self.train(d, 3, *flags)
        out = self.train(d, 6, *flags)
        self.assertIn("resumed from", out)
        a, b = read_metrics(straight), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 7)))
        self.assertEqual([(r["loss"], r["grad_norm"]) for r in a], [(r["loss"], r["grad_norm"]) for r in b], name)
        self.assertEqual(read_bytes(os.path.join(straight, "model.safetensors")),
                         read_bytes(os.path.join(d, "model.safetensors")))
        return straight, out

    def test_blend_resumes_bit_identically_and_prefetch_changes_no_number(self):
        straight, out = self.expect_resume_bit_identical("blend", *BLEND)
        self.assertIn("data blend (weight, file): 0.69999999999999996 data/brown/train.bin 0.29999999999999999 "
                      "data/brown/val.bin", out)
        with open(os.path.join(straight, "train_config.json")) as f:
            self.assertEqual(json.load(f)["data"]["blend"], [0.7, "data/brown/train.bin", 0.3, "data/brown/val.bin"])
        # The same run reading its batches on the step's thread, and with a deeper prefetch.
        for depth in (0, 5):
            d = tmpdir(f"blend_prefetch{depth}")
            self.train(d, 6, *BLEND, f"--data.prefetch={depth}")
            self.assertEqual([(r["loss"], r["grad_norm"]) for r in read_metrics(straight)],
                             [(r["loss"], r["grad_norm"]) for r in read_metrics(d)], f"prefetch {depth}")
        # Not the plain data.train run: the blend reads other samples.
        plain = tmpdir("blend_plain")
        self.train(plain, 6, "--data.shuffle=true", "--zero_optimization.stage=3")
        self.assertNotEqual([r["loss"] for r in read_metrics(straight)], [r["loss"] for r in read_metrics(plain)])

    def test_another_mix_on_resume_is_said(self):
        d = tmpdir("blend_mix")
        self.train(d, 2, *BLEND)
        out = self.train(d, 4, "--data.train=", '--data.blend=[1, "data/brown/train.bin", 1, "data/brown/val.bin"]',
                         "--data.shuffle=true", "--zero_optimization.stage=3")
        self.assertIn('the data mix changed on resume: data.blend was "0.69999999999999996 data/brown/train.bin '
                      '0.29999999999999999 data/brown/val.bin", now "1 data/brown/train.bin 1 data/brown/val.bin"', out)

    def test_fine_tuning_data_resumes_bit_identically_alone_and_blended(self):
        sft = prepare_sft(tmpdir("sft_data"))
        self.expect_resume_bit_identical("sft", f"--data.train={sft}", "--data.shuffle=true",
                                         "--zero_optimization.stage=3")
        self.expect_resume_bit_identical("sft_blend", "--data.train=", f'--data.blend=[1, "{sft}", 1, '
                                         '"data/brown/train.bin"]', "--data.shuffle=true")

    def test_bad_blends_are_refused_before_anything_is_written(self):
        d = os.path.join(tmpdir("blend_bad"), "run")
        cases = [
            (['--data.blend=[1, "data/brown/train.bin"]'], "data.train and data.blend are both set"),
            (["--data.train=", '--data.blend=[0, "data/brown/train.bin"]'], "every weight must be a finite number > 0"),
            (["--data.train=", '--data.blend=[1, "data/brown/train.bin", 2]'],
             "a list of weight and file pairs, [weight, file, weight, file, ...]"),
            (["--data.train=", '--data.blend=["heavy", "data/brown/train.bin"]'], "a number at position 1 (a weight)"),
            (["--data.train=", '--data.blend=[1, "data/brown/train.bin", 1, "data/brown/missing.bin"]'],
             "data/brown/missing.bin"),
        ]
        for flags, message in cases:
            code, out, err, _ = run(BASE + ["--steps=1", f"--out_dir={d}", *flags])
            self.assertNotEqual(code, 0, flags)
            self.assertIn(message, err, flags)
            self.assertFalse(os.path.exists(d), flags)


if __name__ == "__main__":
    unittest.main(argv=main_args())
