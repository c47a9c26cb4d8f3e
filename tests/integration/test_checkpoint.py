"""Checkpoints (src/train/checkpoint.h): a run stopped after step s and resumed reproduces the
uninterrupted run exactly (losses and final weights, bit for bit) and metrics are not duplicated; a
corrupt, truncated or incomplete checkpoint is found (checksum, size, missing checkpoint.json) and
named, and the resume falls back to the previous good one, or refuses, changing nothing; a crash
between the renames of a save is recovered; asking for fewer steps than the checkpoint holds is
refused. The layouts (ZeRO, bf16/fp16, TP, PP, resharding) are tested in tests/mpi/test_checkpoint.cpp."""
import fcntl
import json
import os
import shutil
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, kill_session, main_args, read_bytes, read_metrics, run, tmpdir, write_bytes

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

    def test_damaged_checkpoints_are_named_and_the_previous_good_one_is_used(self):
        d = tmpdir("damaged")
        self.train(d, 6, "--checkpoint_interval=2", "--checkpoint_keep=3")
        # Step 6: one flipped bit in a shard. Step 4: checkpoint.json lost. Step 2: a crash between
        # a save's two renames left it as step-000002.replaced. And an interrupted save's .tmp.
        shard = os.path.join(ckpt(d, 6), "rank-00000.safetensors")
        data = bytearray(read_bytes(shard))
        data[-5] ^= 0x40
        write_bytes(shard, bytes(data))
        os.remove(os.path.join(ckpt(d, 4), "checkpoint.json"))
        os.rename(ckpt(d, 2), ckpt(d, 2) + ".replaced")
        shutil.copytree(ckpt(d, 6), ckpt(d, 8) + ".tmp")
        out = self.train(d, 8)
        self.assertIn("ignoring " + ckpt(d, 8) + ".tmp", out)
        self.assertIn(shard + "' is corrupt: its CRC-32C", out)
        self.assertIn(os.path.join(ckpt(d, 4), "checkpoint.json") + "' is missing", out)
        self.assertIn("falling back", out)
        self.assertIn("recovering " + ckpt(d, 2), out)
        self.assertIn("after step 2", out)
        self.expect_same_as_straight(d)

    def test_every_rank_checksums_and_verifies_its_share_of_the_shards(self):
        # ZeRO-2: a shard per rank. Each rank records its own shard's CRC-32C at the save and, at a
        # resume, verifies every world-size-th shard: rank 1 finds the flipped bit in its shard, and
        # rank 0 names it.
        d = tmpdir("zero_shards")
        self.train(d, 4, "--checkpoint_interval=2", "--zero_optimization.stage=2")
        with open(os.path.join(ckpt(d, 4), "checkpoint.json")) as f:
            files = json.load(f)["files"]
        self.assertEqual([f["file"] for f in files], ["rank-00000.safetensors", "rank-00001.safetensors"])
        for f in files:
            self.assertEqual(f["bytes"], os.path.getsize(os.path.join(ckpt(d, 4), f["file"])))
        shard = os.path.join(ckpt(d, 4), "rank-00001.safetensors")
        data = bytearray(read_bytes(shard))
        data[len(data) // 2] ^= 0x01
        write_bytes(shard, bytes(data))
        out = self.train(d, 6, "--zero_optimization.stage=2")
        self.assertIn(shard + "' is corrupt: its CRC-32C", out)
        self.assertIn("falling back", out)
        self.assertIn("after step 2", out)

    def test_truncated_only_checkpoint_and_fewer_steps_are_refused_changing_nothing(self):
        d = tmpdir("refused")
        self.train(d, 2)
        meta = read_bytes(os.path.join(ckpt(d, 2), "checkpoint.json"))
        code, out, err, _ = run(BASE + ["--steps=1", f"--out_dir={d}"])
        self.assertNotEqual(code, 0)
        self.assertIn("step 2, beyond --steps=1", err)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "checkpoints"))), ["latest", "step-000002"])
        self.assertEqual(read_bytes(os.path.join(ckpt(d, 2), "checkpoint.json")), meta)

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

    def test_a_changed_global_batch_continues_from_the_tokens_consumed(self):
        d = tmpdir("batch")
        self.train(d, 2)  # 2 ranks x 4 x 32 tokens per step: 512 consumed
        out = self.train(d, 3, "--gradient_accumulation_steps=2")  # 512 per step from here
        self.assertIn("continuing from the 512 tokens the checkpoint consumed, at token 512", out)
        with open(os.path.join(ckpt(d, 3), "checkpoint.json")) as f:
            self.assertEqual(json.load(f)["tokens_consumed"], 512 + 512)

    def test_export_streams_the_checkpoint_into_hf_files(self):
        out = tmpdir("export")
        code, o, err, _ = run(["export", "--run", self.straight, "--out", out, "--source", "checkpoint",
                               "--max-shard-size", "1MB"])
        self.assertEqual(code, 0, o + err)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        from safetensors.numpy import load_file
        final = load_file(os.path.join(self.straight, "model.safetensors"))
        self.assertEqual(set(index["weight_map"]), set(final))
        exported = {}
        for name in sorted(set(index["weight_map"].values())):
            exported.update(load_file(os.path.join(out, name)))
        self.assertGreater(len(set(index["weight_map"].values())), 1)
        for name, t in final.items():
            self.assertTrue((exported[name] == t).all(), name)
        inside = os.path.join(self.straight, "checkpoints", "x")
        code, o, err, _ = run(["export", "--run", self.straight, "--out", inside, "--source", "checkpoint"])
        self.assertNotEqual(code, 0)
        self.assertIn("inside the checkpoints it exports from", err)
        self.assertFalse(os.path.exists(inside))

    def test_async_checkpoints_write_the_same_shards_and_resume_bit_identically(self):
        # checkpoint_async writes the shards on a thread while training goes on (src/train/checkpoint.h):
        # the numbers, the shards' bytes and the resumed run are those of the synchronous saves.
        d = tmpdir("async")
        out = self.train(d, 8, "--checkpoint_async=true", "--checkpoint_interval=2")
        self.assertIn("shardlm: checkpoint of step 2: state copied in", out)
        self.assertIn("shardlm: checkpoint of step 8 committed", out)
        a, b = read_metrics(self.straight), read_metrics(d)
        self.assertEqual([(r["loss"], r["grad_norm"]) for r in a], [(r["loss"], r["grad_norm"]) for r in b])
        self.assertEqual([r["step"] for r in b if "checkpoint_stall_s" in r], [3, 5, 7])  # after the saves of 2, 4, 6
        shards = sorted(f for f in os.listdir(ckpt(self.straight, 8)) if f.endswith(".safetensors"))
        self.assertEqual(shards, sorted(f for f in os.listdir(ckpt(d, 8)) if f.endswith(".safetensors")))
        self.assertTrue(shards)
        for f in shards:
            self.assertEqual(read_bytes(os.path.join(ckpt(self.straight, 8), f)), read_bytes(os.path.join(ckpt(d, 8), f)), f)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "checkpoints"))), ["latest", "step-000006", "step-000008"])
        # Step 6's checkpoint was written while steps 7 and 8 trained: without step 8's, a resume reads it.
        r = os.path.join(tmpdir("async_resumed"), "run")
        shutil.copytree(d, r)
        shutil.rmtree(ckpt(r, 8))
        out = self.train(r, 8, "--checkpoint_async=true", "--checkpoint_interval=2")
        self.assertIn("resumed from " + ckpt(r, 6), out)
        self.expect_same_as_straight(r)

    def test_kill9_mid_pass_with_shuffle_resumes_bit_identically(self):
        # data.shuffle's order is a function of (seed, sample) alone (src/data/loader/data_loader.h), so a job
        # killed with SIGKILL mid-pass (8 of ~15,000 windows read) resumes the same order: DDP and ZeRO-3.
        for zero in ("0", "3"):
            flags = ["--data.shuffle=true", f"--zero_optimization.stage={zero}"]
            straight = tmpdir("shuffled_straight")
            self.train(straight, 8, *flags)
            if zero == "0":
                self.assertNotEqual([r["loss"] for r in read_metrics(straight)],
                                    [r["loss"] for r in read_metrics(self.straight)], "shuffle changed no window")
            d = tmpdir("killed")
            p = subprocess.Popen([SHARDLM] + BASE + ["--steps=8", f"--out_dir={d}", "--checkpoint_interval=1", *flags],
                                 env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            deadline = time.time() + 120
            metrics = os.path.join(d, "metrics.jsonl")
            while time.time() < deadline and p.poll() is None:
                if os.path.exists(metrics) and len(read_bytes(metrics).splitlines()) >= 3:
                    break
                time.sleep(0.02)
            kill_session(p.pid)  # the launcher, mpirun and every rank (mpirun gives ranks their own groups)
            p.wait(timeout=60)
            # The ranks die after the launcher: wait until none holds out_dir's lock (util/out_dir_lock.h).
            with open(os.path.join(d, ".lock"), "a") as lock:
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        fcntl.flock(lock, fcntl.LOCK_UN)
                        break
                    except BlockingIOError:
                        self.assertLess(time.time(), deadline + 60, "a killed rank still holds out_dir")
                        time.sleep(0.05)
            self.assertLess(len(read_metrics(d)), 8, "the job finished before it was killed")
            out = self.train(d, 8, *flags)
            self.assertIn("resumed from", out)
            a, b = read_metrics(straight), read_metrics(d)
            self.assertEqual([r["step"] for r in b], list(range(1, 9)))
            self.assertEqual([(r["loss"], r["grad_norm"]) for r in a], [(r["loss"], r["grad_norm"]) for r in b],
                             f"ZeRO-{zero}")
            self.assertEqual(read_bytes(os.path.join(straight, "model.safetensors")),
                             read_bytes(os.path.join(d, "model.safetensors")))

    def test_shuffled_resume_on_half_the_ranks_reads_the_same_samples(self):
        # 2 ranks x micro-batch 4 for 4 steps, then 1 rank x 4 x accumulation 2: the same 8 windows per
        # step, so steps 5-8 match the 2-rank run up to fp32 summation order.
        straight, d = tmpdir("shuffled_2"), tmpdir("shuffled_1")
        self.train(straight, 8, "--data.shuffle=true")
        self.train(d, 4, "--data.shuffle=true")
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "1", "--data.val=", "--log_interval=100",
                                 "--steps=8", f"--out_dir={d}", "--data.shuffle=true", "--gradient_accumulation_steps=2"])
        self.assertEqual(code, 0, out + err)
        self.assertNotIn("global batch changed", out + err)  # 8 windows per step before and after
        a, b = read_metrics(straight), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 9)))
        for ra, rb in zip(a[4:], b[4:]):
            self.assertLess(abs(ra["loss"] - rb["loss"]), 1e-5 * abs(ra["loss"]), f"step {ra['step']}")
        # Another window size would shuffle another permutation: refused, nothing changed.
        before = read_bytes(os.path.join(d, "metrics.jsonl"))
        code, out, err, _ = run(BASE + ["--steps=9", f"--out_dir={d}", "--data.shuffle=true",
                                        "--train_micro_batch_size_per_gpu=2"])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("shuffled windows of 128 tokens (micro-batch x seq_len) and this one would shuffle windows of 64",
                      err)
        self.assertEqual(read_bytes(os.path.join(d, "metrics.jsonl")), before)

    def test_resume_on_half_the_ranks_keeps_the_global_batch(self):
        # The same config on 1 rank instead of 2: gradient_accumulation_steps is scaled to 2, so steps
        # 5-8 read the 2-rank run's global samples (fp32 summation order aside). 3 ranks cannot share
        # the checkpoint's 2 micro-batches per step: refused, nothing changed.
        straight, d = tmpdir("keep_batch_2"), tmpdir("keep_batch_1")
        self.train(straight, 8, "--data.shuffle=true")
        self.train(d, 4, "--data.shuffle=true")
        before = read_bytes(os.path.join(d, "metrics.jsonl"))
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "3", "--data.val=", "--steps=8",
                                 f"--out_dir={d}", "--data.shuffle=true"])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("the checkpoint's global batch is 2 micro-batches of 4x32 per step, which 3 data-parallel ranks "
                      "cannot share evenly", err)
        self.assertEqual(read_bytes(os.path.join(d, "metrics.jsonl")), before)
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "1", "--data.val=", "--log_interval=100",
                                 "--steps=8", f"--out_dir={d}", "--data.shuffle=true"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("on 1 data-parallel rank(s) gradient_accumulation_steps is now 2 (was 1)", out + err)
        self.assertNotIn("global batch changed", out + err)
        a, b = read_metrics(straight), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 9)))
        for ra, rb in zip(a[4:], b[4:]):
            self.assertLess(abs(ra["loss"] - rb["loss"]), 1e-5 * abs(ra["loss"]), f"step {ra['step']}")
        # Back on 2 ranks with the same config: the checkpoint remembers the configured accumulation.
        out = self.train(d, 10, "--data.shuffle=true")
        self.assertNotIn("gradient_accumulation_steps is now", out)
        self.assertNotIn("global batch changed", out)


if __name__ == "__main__":
    unittest.main(argv=main_args())
