"""No collective waits forever: when one rank stops participating, the others exit non-zero within
the timeout plus a few seconds, naming the operation and the missing rank. With the collective
checks off, the flight records name what went wrong: a stopped or crashed rank, and a desync
injected into one rank (a skipped collective, a collective of another size) through the test-only
SHARDLM_TEST_DESYNC (parallel/fault_injection.h)."""
import json
import os
import signal
import subprocess
import threading
import time
import unittest

from common import ENV, ROOT, SHARDLM, kill_session, main_args, run, session_pids, tmpdir

TIMEOUT_S = 4


def rank_pids(rank, out_dir):
    """Local processes started by mpirun for the given rank (OpenMPI puts the rank in the environment)
    of the run writing `out_dir`: other tests' shardlm ranks may be running at the same time (ctest -j),
    and signalling one of them would fail that test instead."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (b"OMPI_COMM_WORLD_RANK=%d" % rank in env and b"shardlm" in cmd and b"mpirun" not in cmd
                and out_dir.encode() in cmd):
            pids.append(int(pid))
    return pids


class Timeout(unittest.TestCase):
    def diagnose(self, out_dir):
        """`shardlm diagnose` on the run's flight records (comm/flight_recorder.h): its text output."""
        code, out, err, _ = run(["diagnose", out_dir], timeout=60)
        self.assertEqual(code, 0, out + err)
        print(out)
        return out

    def interrupt_rank_1(self, sig, *extra, keep=None):
        """Trains with 2 ranks, sends `sig` to rank 1 after step 3; returns (stderr, seconds to exit).
        keep: a list that receives the run's out_dir.
        stderr goes to a file (a pipe nobody reads while stdout is read could fill and block the run),
        and a watchdog kills the job if it never reaches step 3 or never exits, so the test cannot hang."""
        out_dir = tmpdir("timeout")
        cmd = [SHARDLM, "train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2",
               "--steps=1000000", "--log_interval=1", f"--comm.timeout_s={TIMEOUT_S}", f"--out_dir={out_dir}",
               "--data.val=", *extra]
        if keep is not None:
            keep.append(out_dir)
        err_path = os.path.join(out_dir + "_stderr.txt")
        with open(err_path, "w") as err_file:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, env=ENV, cwd=ROOT)
        watchdog = threading.Timer(300, p.kill)
        watchdog.start()
        try:
            for line in p.stdout:
                if line.startswith("step 3/"):
                    break
            pids = rank_pids(1, out_dir)
            self.assertTrue(pids, "rank 1 process not found")
            for pid in pids:
                os.kill(pid, sig)
            stopped = time.time()
            p.stdout.read()  # drained until the job closes it
            p.wait(timeout=TIMEOUT_S + 60)
            elapsed = time.time() - stopped
        finally:
            watchdog.cancel()
            if p.poll() is None:
                p.kill()
                p.wait()
        with open(err_path) as f:
            err = f.read()
        os.remove(err_path)
        self.assertNotEqual(p.returncode, 0)
        # The property is "no collective waits forever": the job ends within the timeout plus
        # mpirun's teardown. The slack is wide because a loaded machine (ctest -j) slows the teardown,
        # not the timeout; the seconds taken are printed.
        self.assertLess(elapsed, TIMEOUT_S + 20, f"took {elapsed:.1f}s to exit")
        return err, elapsed

    def desynced_run(self, kind):
        """ZeRO-3, 2 ranks, the tiny config, checks off: rank 1 breaks the order of collectives at the
        reduce-scatter of layers.0 in its second step (kind "skip": leaves it out; "size": calls it on
        half the elements). Returns (flight records by rank, diagnose's text, seconds the job ran)."""
        out_dir = tmpdir("desync")
        cmd = [SHARDLM, "train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2", "--steps=6",
               "--log_interval=1", f"--comm.timeout_s={TIMEOUT_S}", f"--out_dir={out_dir}", "--data.val=",
               "--debug.check_collectives=false", "--zero_optimization.stage=3",
               "--zero_optimization.stage3_param_persistence_threshold=0"]
        env = dict(ENV, SHARDLM_TEST_DESYNC=f"rank=1,kind={kind},phase=reduce-scatter layers.0,occurrence=2")
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S + 60)
        finally:
            if p.poll() is None:
                kill_session(p.pid)
                p.wait()
        elapsed = time.time() - t0
        self.assertNotEqual(p.returncode, 0, out)
        self.assertNotRegex(out, r"step 6/6", out)  # the desync ended the job, not the step count
        self.assertLess(elapsed, TIMEOUT_S + 30, f"took {elapsed:.1f}s")
        # No rank outlives the job.
        for _ in range(50):
            if not session_pids(p.pid):
                break
            time.sleep(0.1)
        self.assertEqual(session_pids(p.pid), [], "processes left behind")
        records = {}
        for r in (0, 1):
            with open(os.path.join(out_dir, "flight_recorder", f"rank{r}.json")) as f:
                records[r] = json.load(f)
        return records, self.diagnose(out_dir), elapsed

    @staticmethod
    def at(record, n):
        """The record's collective number n on 'world'."""
        return next(e for e in record["entries"] if e["comm"] == "world" and e["match_seq"] == n
                    and e["op"] not in ("send", "recv"))

    def test_skipped_collective_is_named_by_diagnose(self):
        records, out, elapsed = self.desynced_run("skip")
        # Rank 1's last collective is its mismatched one, still in flight: its number is the desync's.
        last = [e for e in records[1]["entries"] if e["comm"] == "world"][-1]
        n = last["match_seq"]
        self.assertEqual(last["state"], "started")
        skipped = self.at(records[0], n)
        self.assertEqual(skipped["context"], "train / backward micro 0 / reduce-scatter layers.0")
        self.assertIn(f"desync on communicator 'world' at collective {n}:", out)
        self.assertIn(f"rank 0: reduce_scatter of {skipped['numel']} x Float #{n} on 'world'", out)
        self.assertIn("during train / backward micro 0 / reduce-scatter layers.0", out)  # the call left out
        self.assertIn(f"during {last['context']}", out)  # what rank 1 called instead
        self.assertIn(f"rank 1 skipped a collective: its #{n} is what rank 0 called as #{n + 1}", out)
        print(f"skip: job exited non-zero after {elapsed:.1f}s (timeout {TIMEOUT_S}s)")

    def test_collective_of_another_size_is_named_by_diagnose(self):
        records, out, elapsed = self.desynced_run("size")
        last = [e for e in records[1]["entries"] if e["comm"] == "world"][-1]
        n = last["match_seq"]
        full = self.at(records[0], n)
        phase = "train / backward micro 0 / reduce-scatter layers.0"
        self.assertEqual((last["context"], full["context"]), (phase, phase))
        self.assertEqual(last["numel"] * 2, full["numel"])
        self.assertIn(f"desync on communicator 'world' at collective {n}:", out)
        self.assertIn(f"rank 1: reduce_scatter of {last['numel']} x Float #{n} on 'world', started, during {phase}", out)
        self.assertRegex(out, rf"rank 0: reduce_scatter of {full['numel']} x Float #{n} on 'world', \w+, during {phase}")
        self.assertIn(f"the same operation with different sizes: {last['numel']} elements on rank 1, "
                      f"{full['numel']} on rank 0", out)
        print(f"size: job exited non-zero after {elapsed:.1f}s (timeout {TIMEOUT_S}s)")

    def test_zero3_rank_killed_mid_training_ends_the_job(self):
        # A dead rank (stage 3 gathers parameters in every unit's forward and backward): the job
        # ends within the timeout either way, through mpirun noticing the death or our timeout.
        _, elapsed = self.interrupt_rank_1(signal.SIGKILL, "--zero_optimization.stage=3",
                                           "--zero_optimization.stage3_param_persistence_threshold=0")
        print(f"stage-3 job exited {elapsed:.1f}s after rank 1 was killed")

    def test_stopped_rank_is_named_and_job_exits(self):
        # A hung peer: alive but silent. Only the communication timeout can end this.
        dirs = []
        err, elapsed = self.interrupt_rank_1(signal.SIGSTOP, keep=dirs)
        self.assertIn("timed out after", err, err)
        self.assertIn("Waiting for rank(s): 1", err, err)
        self.assertTrue(any(op in err for op in ("all_reduce", "reduce_scatter", "all_gather", "barrier")), err)
        print(f"job exited {elapsed:.1f}s after rank 1 stopped (timeout {TIMEOUT_S}s); message:\n"
              + "\n".join(l for l in err.splitlines() if "shardlm:" in l))
        # The flight records: rank 0 wrote its own on the timeout; rank 1, stopped, writes one only if
        # mpirun's teardown (SIGCONT, then SIGTERM) lets its watcher answer rank 0's request first.
        # Either way the diagnosis names rank 1 as the one the collective waited for.
        out = self.diagnose(dirs[0])
        self.assertIn("rank 0: timeout in ", out)
        self.assertIn("first problem", out)
        # Rank 1 stopped outside a collective (absent from it), before writing (no record), or inside one
        # (it started it too; rank 0's record says rank 1 never answered its survey).
        self.assertRegex(out, r"rank 1 never did|rank 1 left no flight record|waiting for world rank\(s\) 1 \(they", out)

    def crashed_rank_record(self, sig):
        """Sends a fatal signal to rank 1 of a running job: it writes its record from the signal handler
        (async-signal-safe, comm/flight_signal_dump.cpp) before dying with the same signal. Checks the
        record is complete (every entry the ring held, none left out, numbered without a gap) and that
        `diagnose` names the crash first."""
        dirs = []
        self.interrupt_rank_1(sig, keep=dirs)
        with open(os.path.join(dirs[0], "flight_recorder", "rank1.json")) as f:
            record = json.load(f)  # parses
        name = {signal.SIGSEGV: "Segmentation fault", signal.SIGABRT: "Aborted"}[sig]
        self.assertEqual(record["reason"], f"fatal signal {int(sig)} ({name})")
        self.assertEqual(record["written_by"], "fatal-signal handler")
        self.assertEqual(record["skipped"], 0)
        self.assertGreater(record["recorded"], 0)
        self.assertEqual(len(record["entries"]), min(record["recorded"], record["capacity"]))
        by_comm = {}
        for e in record["entries"]:
            if e["op"] not in ("send", "recv"):
                by_comm.setdefault((e["comm"], tuple(e["world_ranks"])), []).append(e["match_seq"])
        self.assertTrue(by_comm)
        for comm, numbers in by_comm.items():  # each communicator's collectives, without a gap
            self.assertEqual(numbers, list(range(numbers[0], numbers[0] + len(numbers))), comm)
        for e in record["entries"]:
            self.assertLessEqual(e["t_start"], record["time"])
            self.assertIn(e["state"], ("started", "completed", "failed"))
        out = self.diagnose(dirs[0])
        self.assertIn(f"rank 1: fatal signal {int(sig)}", out)
        self.assertRegex(out, rf"first problem \(the likely cause\):\n  rank 1 ended with fatal signal {int(sig)}", out)
        self.assertIn("its last recorded operation: ", out)

    def test_crashed_rank_leaves_its_flight_record(self):
        self.crashed_rank_record(signal.SIGSEGV)

    def test_aborted_rank_leaves_its_flight_record(self):
        self.crashed_rank_record(signal.SIGABRT)

    def test_running_job_writes_flight_records_on_request(self):
        # `touch RUN/flight_recorder/dump_request` on a running job: every rank writes its record
        # and keeps training.
        out_dir = tmpdir("flight_request")
        cmd = [SHARDLM, "train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2",
               "--steps=1000000", "--log_interval=1", f"--out_dir={out_dir}", "--data.val="]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT)
        watchdog = threading.Timer(300, p.kill)
        watchdog.start()
        try:
            for line in p.stdout:
                if line.startswith("step 2/"):
                    break
            os.makedirs(os.path.join(out_dir, "flight_recorder"), exist_ok=True)
            with open(os.path.join(out_dir, "flight_recorder", "dump_request"), "w") as f:
                f.write("dump\n")
            records = [os.path.join(out_dir, "flight_recorder", f"rank{r}.json") for r in (0, 1)]
            for _ in range(100):
                if all(os.path.exists(r) for r in records):
                    break
                time.sleep(0.1)
            steps = [line for line in (p.stdout.readline(), p.stdout.readline())]
        finally:
            watchdog.cancel()
            p.kill()
            p.wait()
            p.stdout.close()
        self.assertTrue(all(os.path.exists(r) for r in records), os.listdir(os.path.join(out_dir, "flight_recorder")))
        self.assertTrue(all(l.startswith("step ") for l in steps), steps)  # still training
        for r in records:
            with open(r) as f:
                record = json.load(f)
            self.assertTrue(record["reason"].startswith("requested"), record["reason"])
            self.assertGreater(len(record["entries"]), 10)
            self.assertIn("world", {e["comm"] for e in record["entries"]})
        out = self.diagnose(out_dir)
        self.assertIn("flight records of 2 of 2 rank(s)", out)

    def test_pipeline_stage_stopped_is_named(self):
        # Pipeline parallelism: stage 1 (rank 1) stops answering; stage 0, waiting for the gradients
        # stage 1 should send back (or in the step's all-reduce), names it within the timeout.
        err, elapsed = self.interrupt_rank_1(signal.SIGSTOP, "--parallelism.pipeline_parallel=2",
                                             "--gradient_accumulation_steps=2")
        self.assertIn("timed out after", err, err)
        self.assertRegex(err, r"rank\(s\): 1|from rank 1|rank 1\b", err)
        print(f"pipeline job exited {elapsed:.1f}s after stage 1 stopped; message:\n"
              + "\n".join(l for l in err.splitlines() if "shardlm:" in l))

    def test_pipeline_stage_killed_ends_the_job(self):
        _, elapsed = self.interrupt_rank_1(signal.SIGKILL, "--parallelism.pipeline_parallel=2",
                                           "--gradient_accumulation_steps=2")
        print(f"pipeline job exited {elapsed:.1f}s after stage 1 was killed")


if __name__ == "__main__":
    unittest.main(argv=main_args())
