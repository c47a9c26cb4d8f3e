"""Checkpoints (src/train/checkpoint.h): a run stopped after step s and resumed reproduces the
uninterrupted run exactly (losses and final weights, bit for bit) and metrics are not duplicated; a
corrupt, truncated or incomplete checkpoint is found (checksum, size, missing checkpoint.json) and
named, and the resume falls back to the previous good one, or refuses, changing nothing; a crash
between the renames of a save is recovered; asking for fewer steps than the checkpoint holds is
refused. The layouts (ZeRO, bf16/fp16, TP, PP, resharding) are tested in tests/mpi/test_checkpoint.cpp."""
import json
import os
import shutil
import unittest

from common import ROOT, main_args, read_bytes, read_metrics, run, tmpdir, write_bytes

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--nproc", "2", "--data.val=", "--log_interval=100"]


def ckpt(d, step):
    return os.path.join(d, "checkpoints", f"step-{step:06d}")


class Checkpoint(unittest.TestCase):
    straight = None

    @classmethod
    def setUpClass(cls):
        cls.straight = tmpdir("straight")
        code, out, err, _ = run(BASE + ["--steps=8", f"--out_dir={cls.straight}"])
        assert code == 0, out + err

    def train(self, out_dir, steps, *extra):
        code, out, err, _ = run(BASE + [f"--steps={steps}", f"--out_dir={out_dir}", *extra])
        self.assertEqual(code, 0, out + err)
        return out + err

    def expect_same_as_straight(self, d):
        a, b = read_metrics(self.straight), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 9)), "metrics lost or duplicated")
        for ra, rb in zip(a, b):
            self.assertEqual(ra["loss"], rb["loss"], f"step {ra['step']}")
            self.assertEqual(ra["grad_norm"], rb["grad_norm"], f"step {ra['step']}")
        self.assertEqual(read_bytes(os.path.join(self.straight, "model.safetensors")),
                         read_bytes(os.path.join(d, "model.safetensors")))

    def test_resume_reproduces_uninterrupted_run(self):
        d = tmpdir("resumed")
        self.train(d, 4, "--checkpoint_interval=2")
        self.assertEqual(sorted(os.listdir(os.path.join(d, "checkpoints"))), ["latest", "step-000002", "step-000004"])
        with open(os.path.join(ckpt(d, 4), "checkpoint.json")) as f:
            meta = json.load(f)
        self.assertEqual(meta["step"], 4)
        self.assertEqual(meta["layout"]["dp"], 2)
        self.assertEqual(meta["tokens_consumed"], 4 * 2 * 4 * 32)  # steps x dp x micro-batch x seq
        self.assertEqual([f["file"] for f in meta["files"]], ["rank-00000.safetensors"])  # DDP: dp rank 0 only
        out = self.train(d, 8)
        self.assertIn("resumed from", out)
        self.assertIn("after step 4", out)
        self.expect_same_as_straight(d)

    def test_corrupt_newest_checkpoint_falls_back_to_previous(self):
        d = tmpdir("corrupt")
        self.train(d, 4, "--checkpoint_interval=2")
        shard = os.path.join(ckpt(d, 4), "rank-00000.safetensors")
        data = bytearray(read_bytes(shard))
        data[-5] ^= 0x40  # one flipped bit in the last tensor's data
        write_bytes(shard, bytes(data))
        out = self.train(d, 8)
        self.assertIn(shard, out)
        self.assertIn("CRC-32C", out)
        self.assertIn("falling back", out)
        self.assertIn("after step 2", out)
        self.expect_same_as_straight(d)

    def test_truncated_only_checkpoint_is_refused_and_nothing_changes(self):
        d = tmpdir("truncated")
        self.train(d, 2)
        shard = os.path.join(ckpt(d, 2), "rank-00000.safetensors")
        data = read_bytes(shard)
        write_bytes(shard, data[: len(data) // 2])
        before = read_bytes(os.path.join(d, "metrics.jsonl"))
        code, out, err, _ = run(BASE + ["--steps=4", f"--out_dir={d}"])
        self.assertNotEqual(code, 0)
        self.assertIn(shard, err)
        self.assertIn("truncated", err)
        self.assertIn("no usable checkpoint", err)
        self.assertEqual(read_bytes(os.path.join(d, "metrics.jsonl")), before)
        self.assertEqual(len(read_bytes(shard)), len(data) // 2, "the damaged checkpoint must be left for inspection")

    def test_fewer_steps_than_the_checkpoint_is_refused(self):
        d = tmpdir("backwards")
        self.train(d, 4)
        before = read_bytes(os.path.join(ckpt(d, 4), "checkpoint.json"))
        code, out, err, _ = run(BASE + ["--steps=2", f"--out_dir={d}"])
        self.assertNotEqual(code, 0)
        self.assertIn("step 4, beyond --steps=2", err)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "checkpoints"))), ["latest", "step-000004"])
        self.assertEqual(read_bytes(os.path.join(ckpt(d, 4), "checkpoint.json")), before)

    def test_missing_metadata_interrupted_save_and_half_renamed_checkpoint(self):
        d = tmpdir("incomplete")
        self.train(d, 4, "--checkpoint_interval=2")
        # A crash between a save's two renames left step 2 as step-000002.replaced; step 4 lost its
        # checkpoint.json; an interrupted save left step-000006.tmp.
        os.rename(ckpt(d, 2), ckpt(d, 2) + ".replaced")
        os.remove(os.path.join(ckpt(d, 4), "checkpoint.json"))
        shutil.copytree(ckpt(d, 4), ckpt(d, 6) + ".tmp")
        out = self.train(d, 8)
        self.assertIn("ignoring " + ckpt(d, 6) + ".tmp", out)
        self.assertIn("recovering " + ckpt(d, 2), out)
        self.assertIn(os.path.join(ckpt(d, 4), "checkpoint.json") + "' is missing", out)
        self.assertIn("after step 2", out)
        self.expect_same_as_straight(d)


if __name__ == "__main__":
    unittest.main(argv=main_args())
