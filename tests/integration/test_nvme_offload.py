"""NVMe optimizer-state offload (zero_optimization.offload_optimizer.device "nvme";
src/parallel/zero/state_offload.h): the fp32 masters and Adam moments live in files under nvme_path and
stream through a few chunk buffers at each step. Proven against the same run without offload, which is
the reference: losses and grad norms bit for bit on 1 and 2 ranks at ZeRO stages 1-3 in fp32 and bf16
(and with bf16 and 8-bit moments, whose 8-bit blocks cut by shard boundaries need a pass of their own);
checkpoints written from the files equal those written from memory byte for byte, resume in either
direction bit for bit, and reshard to 1 rank without offload; a missing, unwritable or too small
nvme_path stops the run before training with the key and the fix; a disk that fills during the run
does not stop it (the files are rewritten in place, util/direct_file_store.h), and state files lost
during the run stop it with a clear error and the previous checkpoint intact."""
import json
import os
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, TrainsTheBase, main_args, read_bytes, run, step_losses, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--log_interval=100", "--resume=false"]
STAGE1 = "--zero_optimization.stage=1"
# Small chunks (sub_group_size elements) so the tiny model's states take many chunks: the
# streaming, the read-ahead and the buffer reuse all run.
CHUNK = "--zero_optimization.sub_group_size=20000"


def offload(path, *extra):
    return ["--zero_optimization.offload_optimizer.device=nvme",
            f"--zero_optimization.offload_optimizer.nvme_path={path}", CHUNK, *extra]


class NvmeOffload(TrainsTheBase, unittest.TestCase):
    BASE = BASE
    STEPS = 3

    def test_losses_are_bit_identical_to_no_offload(self):
        nvme = tmpdir("nvme")
        # Every pair of (ranks, stage), (stage, precision) and (ranks, precision) once: 6 runs, not 12.
        cases = [(1, 1, False), (2, 1, True), (2, 2, False), (1, 2, True), (2, 3, True), (1, 3, False)]
        for nproc, stage, bf16 in cases:
            with self.subTest(nproc=nproc, stage=stage, bf16=bf16):
                flags = [f"--zero_optimization.stage={stage}", f"--bf16.enabled={'true' if bf16 else 'false'}"]
                plain, off = tmpdir("plain"), tmpdir("off")
                self.train(plain, *flags, nproc=nproc)
                out = self.train(off, *flags, *offload(nvme), nproc=nproc)
                self.assertIn(f"on NVMe at {nvme} (", out)
                self.assertTrue("(O_DIRECT)" in out or "buffered + fadvise(DONTNEED)" in out, out)
                self.assertIn("(fp32 masters + moments)" if bf16 else "(moments)", out)
                self.assertEqual(step_losses(plain), step_losses(off))
                self.assertEqual(read_bytes(os.path.join(plain, "model.safetensors")),
                                 read_bytes(os.path.join(off, "model.safetensors")))
        self.assertEqual(os.listdir(nvme), [], "the state files outlive the run")

    def test_offloaded_bytes_leave_the_resident_ones_in_memory_json_and_the_plan_alike(self):
        nvme = tmpdir("nvme_mem")
        for flags in (["--zero_optimization.stage=2", "--bf16.enabled=true"],
                      ["--zero_optimization.stage=3", "--optimizer.state_precision=8bit"]):
            with self.subTest(flags=flags):
                plain, off = tmpdir("mem_plain"), tmpdir("mem_off")
                self.train(plain, *flags, steps=1)
                out = self.train(off, *flags, *offload(nvme), steps=1)
                with open(os.path.join(plain, "memory.json")) as f:
                    before = json.load(f)
                with open(os.path.join(off, "memory.json")) as f:
                    after = json.load(f)
                with open(os.path.join(off, "plan.json")) as f:
                    plan = json.load(f)["stages"][0]
                self.assertEqual(after["offloaded"], before["master_params"] + before["optimizer_states"])
                self.assertGreater(after["offloaded"], 0)
                self.assertEqual((after["master_params"], after["optimizer_states"]), (0, 0))
                self.assertEqual(after["total_model_states"], before["total_model_states"] - after["offloaded"])
                for key in ("compute_params", "gradients", "master_params", "optimizer_states", "offloaded",
                            "total_model_states"):
                    self.assertEqual(after[key], plan[key], key)
                self.assertIn("on disk (NVMe offload)", out)

    def test_compact_moments_are_bit_identical_to_no_offload(self):
        # 8-bit moments on 2 ranks at stage 2: quantization blocks that the shard boundary cuts share one
        # absmax across ranks, agreed before any chunk steps. min_8bit_size 1 quantizes every tensor.
        nvme = tmpdir("nvme8")
        for precision in ("8bit", "bf16"):
            with self.subTest(precision=precision):
                flags = ["--zero_optimization.stage=2", f"--optimizer.state_precision={precision}",
                         "--optimizer.min_8bit_size=1", "--bf16.enabled=true"]
                plain, off = tmpdir("plain8"), tmpdir("off8")
                self.train(plain, *flags, steps=4)
                self.train(off, *flags, *offload(nvme), steps=4)
                self.assertEqual(step_losses(plain), step_losses(off))

    def test_checkpoints_equal_those_without_offload_and_resume_either_way(self):
        nvme = tmpdir("nvme_ckpt")
        flags = ["--zero_optimization.stage=2", "--bf16.enabled=true", "--checkpoint_interval=2"]
        straight, plain, off = tmpdir("straight"), tmpdir("plain_ck"), tmpdir("off_ck")
        self.train(straight, *flags, steps=4)
        self.train(plain, *flags, steps=2)
        self.train(off, *flags, *offload(nvme), steps=2)
        shard = os.path.join("checkpoints", "step-000002", "rank-00001.safetensors")
        self.assertEqual(read_bytes(os.path.join(plain, shard)), read_bytes(os.path.join(off, shard)))
        # Written from memory, resumed with offload; written from the files, resumed without.
        resume = ["--resume=true", "--steps=4"]
        for d, extra in ((plain, offload(nvme)), (off, [])):
            code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100", "--nproc", "2",
                                     f"--out_dir={d}", *flags, *resume, *extra])
            self.assertEqual(code, 0, out + err)
            self.assertIn("resumed from", out + err)
            self.assertEqual(step_losses(straight), step_losses(d), d)

    def test_resharded_to_one_rank_without_offload(self):
        # 2 ranks offloaded save; 1 rank without offload resumes (accumulation 2 keeps the global batch)
        # as it resumes a checkpoint written without offload: the same losses, bit for bit.
        nvme = tmpdir("nvme_reshard")
        flags = ["--zero_optimization.stage=3", "--checkpoint_interval=2"]
        plain, off = tmpdir("reshard_plain"), tmpdir("reshard_off")
        self.train(plain, *flags, steps=2)
        self.train(off, *flags, *offload(nvme), steps=2)
        for d in (plain, off):
            code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100", "--nproc", "1",
                                     f"--out_dir={d}", *flags, "--resume=true", "--steps=4"])
            self.assertEqual(code, 0, out + err)
        self.assertEqual(step_losses(plain), step_losses(off))
        # And back: the 1-rank checkpoint of step 4 resumed on 2 ranks with offload.
        for d, extra in ((plain, []), (off, offload(nvme))):
            code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100", "--nproc", "2",
                                     f"--out_dir={d}", *flags, "--resume=true", "--steps=6", *extra])
            self.assertEqual(code, 0, out + err)
        self.assertEqual(step_losses(plain), step_losses(off))

    def test_bad_nvme_path_stops_before_training(self):
        base = tmpdir("nvme_bad")
        a_file = os.path.join(base, "a_file")
        with open(a_file, "w") as f:
            f.write("x")
        cases = [
            (os.path.join(base, "missing"), "does not exist"),
            (a_file, "is not a directory"),
            ("/proc/self", "is not writable"),
        ]
        for path, message in cases:
            with self.subTest(path=path):
                d = os.path.join(base, "run")
                code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={d}", STAGE1, *offload(path)])
                self.assertNotEqual(code, 0, out + err)
                self.assertIn(f"zero_optimization.offload_optimizer.nvme_path = '{path}' {message}", err)
                self.assertNotIn("step 1/", out)
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={base}/r2", STAGE1,
                                        "--zero_optimization.offload_optimizer.device=nvme"])
        self.assertNotEqual(code, 0)
        self.assertIn("needs zero_optimization.offload_optimizer.nvme_path", err)
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={base}/r3",
                                        "--zero_optimization.stage=0", *offload(base)])
        self.assertNotEqual(code, 0)
        self.assertIn("needs ZeRO (as in DeepSpeed): set zero_optimization.stage to 1, 2 or 3", err)

    @unittest.skipUnless(os.geteuid() == 0, "mounting a tmpfs needs root")
    def test_a_full_disk_is_refused_before_training_but_not_during_it_and_lost_files_stop_a_run(self):
        mnt = tmpdir("nvme_full")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt]).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        try:
            # The tiny model's fp32 moments (~4.9 MB) do not fit in 1 MB: refused by the check.
            d = tmpdir("full_run")
            code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={d}/run", STAGE1, *offload(mnt)])
            self.assertNotEqual(code, 0, out + err)
            self.assertIn(f"zero_optimization.offload_optimizer.nvme_path = '{mnt}' has", err)
            self.assertIn("free space there or point zero_optimization.offload_optimizer.nvme_path at a larger disk", err)
            # Room for the states at the start; filled up by another writer during the run: the state files
            # are rewritten in place, so training goes on. Then the files are removed under the running job:
            # it stops naming the key, and its last checkpoint resumes.
            subprocess.run(["mount", "-o", "remount,size=8m", mnt], check=True)
            d = tmpdir("full_during_run")
            p = subprocess.Popen([SHARDLM] + BASE + ["--nproc", "1", "--steps=100000", "--checkpoint_interval=1",
                                                     f"--out_dir={d}", STAGE1, *offload(mnt)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
            latest = os.path.join(d, "checkpoints", "latest")

            def saved_step():
                try:
                    with open(latest) as f:
                        return int(f.read().strip().split("-")[1])
                except (OSError, ValueError, IndexError):
                    return -1

            def wait_for(step):
                deadline = time.time() + 120
                while saved_step() < step and p.poll() is None and time.time() < deadline:
                    time.sleep(0.05)
                return saved_step()

            try:
                first = wait_for(1)
                subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=64k"], capture_output=True)
                self.assertEqual(os.statvfs(mnt).f_bavail, 0, "the filler did not fill the disk")
                self.assertGreaterEqual(wait_for(first + 3), first + 3, "training stopped when the disk filled")
                self.assertIsNone(p.poll())
                for name in os.listdir(mnt):
                    if name.startswith("shardlm_states"):
                        os.remove(os.path.join(mnt, name))
                out, err = p.communicate(timeout=300)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            self.assertNotEqual(p.returncode, 0, out + err)
            self.assertIn("zero_optimization.offload_optimizer.nvme_path", err)
            saved = saved_step()
            code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100", "--nproc", "1",
                                     f"--out_dir={d}", STAGE1, f"--steps={saved + 1}"])
            self.assertEqual(code, 0, out + err)
            self.assertIn(f"after step {saved}", out + err)
        finally:
            subprocess.run(["umount", mnt])


if __name__ == "__main__":
    unittest.main(argv=main_args())
