"""What keeps a run from hurting the machine or another run: the memory guard (without device_memory a
run is planned against the memory this machine has free and refused before it allocates the model),
--nproc checked against the cores before mpirun starts, the out_dir lock held by the rank that writes
(a second job is refused naming the holder; a stale lock of a dead process does not block), and every
rank's peak memory recorded per step."""
import fcntl
import json
import os
import signal
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, main_args, read_metrics, run, tmpdir

DEMO = os.path.join(ROOT, "configs", "demo.json")
TINY = os.path.join(ROOT, "configs", "tiny.json")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class MemoryGuard(unittest.TestCase):
    def test_model_larger_than_the_machine_is_refused_before_it_allocates(self):
        for nproc in ([], ["--nproc", "2"]):
            d = os.path.join(tmpdir("guard70b"), "run")
            code, out, err, _ = run(["train", "--config", DEMO, "--model.preset=llama-70b", f"--out_dir={d}", *nproc],
                                    timeout=120)
            self.assertNotEqual(code, 0, out)
            self.assertIn("does not fit", err)
            self.assertIn("device_memory is not set", err)
            self.assertIn("MemAvailable", err)
            self.assertIn("--zero_optimization.stage=3", err)  # the fixes are named
            self.assertIn("--device_memory=SIZE", err)
            self.assertEqual(err.count("does not fit"), 1, "reported once, before ranks start")
            self.assertFalse(os.path.exists(d), "nothing should be written for a refused run")
            if nproc:
                self.assertIn("/ 2 ranks on this node", err)
                self.assertIn("per rank process", err)

    def test_device_memory_overrides_what_the_machine_has(self):
        # The same model planned for an explicit amount: the message is about device_memory alone.
        code, out, err, _ = run(["train", "--config", DEMO, "--model.preset=llama-70b", "--device_memory=1TB",
                                 f"--out_dir={tmpdir('guard_dm')}/run"], timeout=120)
        self.assertNotEqual(code, 0, out)
        self.assertIn("does not fit device_memory", err)
        self.assertNotIn("device_memory is not set", err)

    def test_too_many_ranks_refused_before_mpirun(self):
        d = os.path.join(tmpdir("guard_nproc"), "run")
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "100000", f"--out_dir={d}"], timeout=120)
        self.assertNotEqual(code, 0, out)
        self.assertIn("--nproc 100000", err)
        self.assertIn("core(s)", err)
        self.assertNotIn("mpirun:", err)  # mpirun never started
        self.assertFalse(os.path.exists(d))


class OutDirLock(unittest.TestCase):
    def hold_lock(self, d, who):
        os.makedirs(d, exist_ok=True)
        f = open(os.path.join(d, ".lock"), "w")
        f.write(who + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f

    def test_second_job_refused_naming_the_holder(self):
        d = tmpdir("lock_held")
        holder = self.hold_lock(d, "pid 4242 on elsewhere")
        try:
            for nproc in ([], ["--nproc", "2"]):
                code, out, err, _ = run(["train", "--config", TINY, "--steps=1", f"--out_dir={d}", *nproc])
                self.assertNotEqual(code, 0, out)
                self.assertIn("in use by another job (pid 4242 on elsewhere)", err)
                self.assertEqual(err.count("in use by another job"), 1)
                self.assertFalse(os.path.exists(os.path.join(d, "metrics.jsonl")))
        finally:
            holder.close()

    def test_stale_lock_does_not_block_and_every_rank_reports_memory(self):
        # A .lock left by a process that died (its flock went with it) does not block.
        d = tmpdir("lock_stale")
        with open(os.path.join(d, ".lock"), "w") as f:
            f.write("pid 999999 on gone\n")
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", "--steps=2", "--threads=1",
                                 f"--out_dir={d}", "--data.val="])
        self.assertEqual(code, 0, out + err)
        for m in read_metrics(d):
            ranks = [m[f"memory_peak_rss.rank{r}"] for r in (0, 1)]
            self.assertTrue(all(r > 0 for r in ranks), m)
            self.assertEqual(m["memory_peak_rss_max"], max(ranks))
            self.assertEqual(m["memory_peak_rss_min"], min(ranks))
            self.assertAlmostEqual(m["memory_peak_rss_imbalance"], max(ranks) / min(ranks))
        self.assertNotIn("memory_peak_rss.rank2", read_metrics(d)[-1])

    def test_lock_held_by_the_writing_rank_outlives_a_killed_launcher(self):
        # After kill -9 of the launcher (mpirun), OpenMPI's ranks live on a moment and keep writing: the
        # lock is rank 0's, so it is held exactly as long as a rank can still write.
        d = tmpdir("lock_kill")
        job = subprocess.Popen([SHARDLM, "train", "--config", TINY, "--nproc", "2", "--steps=100000", "--threads=1",
                                f"--out_dir={d}", "--data.val="], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            metrics = os.path.join(d, "metrics.jsonl")
            deadline = time.time() + 300
            while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
                self.assertIsNone(job.poll(), "the first job ended early")
                self.assertLess(time.time(), deadline, "the first job wrote no step")
                time.sleep(0.2)
            with open(os.path.join(d, ".lock")) as f:
                holder = f.read().split()
            rank_pid = int(holder[1])
            self.assertNotEqual(rank_pid, job.pid, "the lock must be held by the writing rank, not the launcher")
            code, out, err, _ = run(["train", "--config", TINY, "--steps=1", f"--out_dir={d}"])
            self.assertNotEqual(code, 0, out)
            self.assertIn(f"in use by another job (pid {rank_pid} on", err)
            os.kill(job.pid, signal.SIGKILL)
            job.wait()
            while pid_alive(rank_pid):  # the rank ends on its own once it sees the launcher gone
                self.assertLess(time.time(), deadline, "rank 0 outlived its launcher")
                time.sleep(0.1)
            code, out, err, _ = run(["train", "--config", TINY, "--steps=1", f"--out_dir={d}", "--data.val=",
                                     "--resume=false"])
            self.assertEqual(code, 0, out + err)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


if __name__ == "__main__":
    unittest.main(argv=main_args())
