"""Checkpoints: a run stopped after step s and resumed reproduces the uninterrupted run exactly
(losses and final weights, bit for bit), metrics are not duplicated, and a corrupt checkpoint is
refused with a message naming the file, leaving the run directory as it was."""
import os
import unittest

from common import ROOT, main_args, read_bytes, read_metrics, run, tmpdir, write_bytes

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--nproc", "2", "--data.val=", "--log_interval=100"]


class Checkpoint(unittest.TestCase):
    def train(self, out_dir, steps, *extra):
        code, out, err, _ = run(BASE + [f"--steps={steps}", f"--out_dir={out_dir}", *extra])
        self.assertEqual(code, 0, out + err)
        return out

    def test_resume_reproduces_uninterrupted_run(self):
        straight, resumed = tmpdir("straight"), tmpdir("resumed")
        self.train(straight, 10)
        self.train(resumed, 6)
        out = self.train(resumed, 10)
        self.assertIn("resumed from", out)
        self.assertIn("after step 6", out)
        a, b = read_metrics(straight), read_metrics(resumed)
        self.assertEqual([r["step"] for r in b], list(range(1, 11)), "metrics lost or duplicated")
        for ra, rb in zip(a, b):
            self.assertEqual(ra["loss"], rb["loss"], f"step {ra['step']}")
            self.assertEqual(ra["grad_norm"], rb["grad_norm"], f"step {ra['step']}")
        self.assertEqual(read_bytes(os.path.join(straight, "model.safetensors")),
                         read_bytes(os.path.join(resumed, "model.safetensors")))

    def test_interval_checkpoints_and_corrupt_checkpoint_is_refused(self):
        d = tmpdir("corrupt")
        self.train(d, 4, "--checkpoint_interval=2")
        ckpt = os.path.join(d, "checkpoint", "optimizer.safetensors")
        data = read_bytes(ckpt)
        write_bytes(ckpt, data[: len(data) // 2])
        before = read_bytes(os.path.join(d, "metrics.jsonl"))
        code, out, err, _ = run(BASE + ["--steps=8", f"--out_dir={d}"])
        self.assertNotEqual(code, 0)
        self.assertIn("optimizer.safetensors", err)
        self.assertIn("truncated", err)
        self.assertEqual(read_bytes(os.path.join(d, "metrics.jsonl")), before)


if __name__ == "__main__":
    unittest.main(argv=main_args())
