"""Elastic restarts (`train --max-restarts K [--min-nproc M]`, src/cli/elastic.h): a rank killed
(SIGKILL) mid-run is restarted from the newest checkpoint; on the same number of ranks the whole run
equals an uninterrupted one bit for bit; with the hostfile lowered to one slot the run continues on 1
rank with accumulation doubled, matching the 2-rank run to fp32 summation order; each restart is in
restarts.jsonl, in the metrics and in the report; restarts used up, or too few ranks left for
--min-nproc, stop with a message; the flags are refused where no launcher supervises. (The fp64
proof that a shrink reads the same samples is tests/mpi/test_checkpoint.cpp's reshard matrix.)"""
import json
import os
import signal
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, kill_session, main_args, read_bytes, read_metrics, run, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
FLAGS = ["--data.val=", "--steps=60", "--checkpoint_interval=4", "--log_interval=1000", "--resume=false",
         "--data.shuffle=true", "--zero_optimization.stage=3"]


def rank_pids(out_dir):
    """The running ranks of the job writing out_dir (processes mpirun started: OMPI_COMM_WORLD_RANK)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=" in env and out_dir.encode() in cmd:
            pids.append(int(name))
    return pids


def two_slot_hostfile(out_dir):
    """A hostfile of 2 localhost slots in out_dir, and a function that takes one slot away (a node
    lost: what an operator or a health check does to the file before the restart)."""
    path = os.path.join(out_dir, "hosts")
    with open(path, "w") as f:
        f.write("localhost slots=2\n")

    def lose_a_slot():
        with open(path, "w") as f:
            f.write("localhost slots=1  # one slot lost\n")
    return path, lose_a_slot


def steps_written(out_dir):
    try:
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Elastic(unittest.TestCase):
    def launch(self, out_dir, *args):
        return subprocess.Popen([SHARDLM, "train", "--config", TINY, f"--out_dir={out_dir}", *FLAGS, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
                                start_new_session=True)

    def finish(self, p, timeout=300):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(p.pid)
            out, err = p.communicate()
            self.fail("the supervised job did not finish: " + err[-2000:])
        return p.returncode, out, err

    def kill_a_rank_after(self, out_dir, steps, before_kill=None):
        """SIGKILL to one rank once `steps` steps are in metrics.jsonl (as a crashed node would die)."""
        deadline = time.time() + 120
        while steps_written(out_dir) < steps:
            self.assertLess(time.time(), deadline, "the job never reached step %d" % steps)
            time.sleep(0.005)
        if before_kill:
            before_kill()
        pids = rank_pids(out_dir)
        self.assertTrue(pids, "no rank found")
        os.kill(pids[-1], signal.SIGKILL)

    def straight(self, nproc="2"):
        d = tmpdir("elastic_straight")
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", nproc, f"--out_dir={d}", *FLAGS])
        self.assertEqual(code, 0, out + err)
        return d

    def test_a_killed_rank_restarts_from_the_checkpoint_bit_identically(self):
        ref, d = self.straight(), tmpdir("elastic_same")
        p = self.launch(d, "--nproc", "2", "--max-restarts", "2")
        self.kill_a_rank_after(d, 10)
        code, out, err = self.finish(p)
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("restart 1 of 2 on 2 rank(s) (was 2) from the checkpoint of step", err)
        with open(os.path.join(d, "restarts.jsonl")) as f:
            restarts = [json.loads(line) for line in f]
        self.assertEqual(len(restarts), 1)
        self.assertEqual((restarts[0]["ranks_before"], restarts[0]["ranks"]), (2, 2))
        self.assertNotEqual(restarts[0]["exit_status"], 0)
        a, b = read_metrics(ref), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 61)), "metrics lost or duplicated")
        self.assertEqual([(r["loss"], r["grad_norm"]) for r in a], [(r["loss"], r["grad_norm"]) for r in b])
        self.assertEqual(read_bytes(os.path.join(ref, "model.safetensors")), read_bytes(os.path.join(d, "model.safetensors")))
        resumed = restarts[0]["resume_step"]
        self.assertGreater(resumed, 0)
        self.assertEqual([r.get("restarts", 0) for r in b], [0] * resumed + [1] * (60 - resumed))
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(d, "report.html")) as f:
            self.assertIn('id="restarts"', f.read())
        self.assertEqual(rank_pids(d), [], "orphaned ranks")

    def test_a_lost_slot_continues_on_fewer_ranks_with_the_same_samples(self):
        ref, d = self.straight(), tmpdir("elastic_shrink")
        hostfile, lose_a_slot = two_slot_hostfile(d)
        p = self.launch(d, "--hostfile", hostfile, "--max-restarts", "1")
        self.kill_a_rank_after(d, 10, lose_a_slot)
        code, out, err = self.finish(p)
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("on 1 rank(s) (was 2)", err)
        self.assertIn("gradient_accumulation_steps is now 2 (was 1)", out + err)
        with open(os.path.join(d, "restarts.jsonl")) as f:
            resumed = json.loads(f.readline())["resume_step"]
        a, b = read_metrics(ref), read_metrics(d)
        self.assertEqual([r["step"] for r in b], list(range(1, 61)))
        self.assertEqual([r["loss"] for r in a[:resumed]], [r["loss"] for r in b[:resumed]])
        # The same 8 windows per step in another summation order: fp32 rounding, which Adam at lr 1e-2
        # then amplifies step by step, so the first steps after the restart are compared.
        for ra, rb in zip(a[resumed:resumed + 3], b[resumed:resumed + 3]):
            self.assertLess(abs(ra["loss"] - rb["loss"]), 1e-5 * ra["loss"], f"step {ra['step']}")

    def test_restarts_used_up_or_too_few_ranks_stop_with_a_message(self):
        d = tmpdir("elastic_none")
        p = self.launch(d, "--nproc", "2", "--max-restarts", "0")
        self.kill_a_rank_after(d, 6)
        code, out, err = self.finish(p)
        self.assertNotEqual(code, 0)
        self.assertIn("--max-restarts 0 allows no restart, so it stops here", err)
        d = tmpdir("elastic_min")
        hostfile, lose_a_slot = two_slot_hostfile(d)
        p = self.launch(d, "--hostfile", hostfile, "--max-restarts", "3", "--min-nproc", "2")
        self.kill_a_rank_after(d, 6, lose_a_slot)
        code, out, err = self.finish(p)
        self.assertNotEqual(code, 0)
        self.assertIn("cannot restart: 1 rank(s) are available in " + hostfile + ", and no count between --min-nproc 2",
                      err)

    def test_the_flags_need_a_launcher(self):
        for flags, message in [(["--max-restarts", "2"], "use them with --nproc N (N > 1) or --hostfile"),
                               (["--nproc", "2", "--min-nproc", "2"], "--min-nproc needs --max-restarts K"),
                               (["--nproc", "2", "--max-restarts", "x"], "--max-restarts must be an integer >= 0")]:
            code, out, err, _ = run(["train", "--config", TINY, *FLAGS, *flags])
            self.assertNotEqual(code, 0, flags)
            self.assertIn(message, err, flags)


if __name__ == "__main__":
    unittest.main(argv=main_args())
