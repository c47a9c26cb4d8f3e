"""A config written for DeepSpeed runs as it is (issue 12): configs/deepspeed_seed.json gives
train_batch_size and gradient_accumulation_steps only, so the micro-batch follows from the job's
data-parallel size (256 / (4 x 2) = 32), and its ZeRO-2 keys keep DeepSpeed's meaning."""
import json
import os
import unittest

from common import ROOT, main_args, read_metrics, run, tmpdir

SEED = os.path.join(ROOT, "configs", "deepspeed_seed.json")
# The seed config names no model or data: the tiny model over the bundled Brown tokens (4096 pieces);
# a short sequence keeps micro-batches of 32 quick on two cores.
SMALL = ["--model.preset=tiny", "--model.vocab_size=4096", "--data.train=data/brown/train.bin",
         "--data.seq_len=16", "--steps=2", "--resume=false"]


class DeepSpeedConfig(unittest.TestCase):
    def test_seed_config_runs_on_two_ranks_with_the_derived_micro_batch(self):
        out_dir = os.path.join(tmpdir("dsseed"), "run")
        code, out, err, _ = run(["train", "--config", SEED, "--nproc", "2", f"--out_dir={out_dir}", *SMALL], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertIn("micro-batch 32 x seq 16 x accumulation 4 x dp 2", out)
        self.assertIn("ZeRO stage 2, fp16", out)
        m = read_metrics(out_dir)
        self.assertEqual([r["step"] for r in m], [1, 2])
        with open(os.path.join(out_dir, "train_config.json")) as f:
            resolved = json.load(f)
        self.assertEqual((resolved["train_batch_size"], resolved["train_micro_batch_size_per_gpu"],
                          resolved["gradient_accumulation_steps"]), (256, 32, 4))
        self.assertEqual(resolved["zero_optimization"]["reduce_bucket_size"], 2e8)

    def test_a_batch_that_does_not_divide_shows_the_arithmetic(self):
        code, out, err, _ = run(["train", "--config", SEED, "--nproc", "2", "--train_batch_size=100", *SMALL],
                                timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("gradient_accumulation_steps x data-parallel ranks = 4 x 2 = 8", err)
        self.assertEqual(err.count("is not divisible"), 1, "reported once, before ranks start")

    def test_offload_is_refused_naming_the_missing_feature(self):
        code, out, err, _ = run(["train", "--config", SEED, *SMALL,
                                 '--zero_optimization.offload_optimizer={"device": "cpu"}'], timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("ZeRO-Offload) is not implemented", err)
        self.assertNotIn("unknown config key", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
