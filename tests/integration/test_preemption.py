"""Preemption (train/preemption.h): a scheduler's SIGTERM or SIGUSR1 reaching the `--nproc` launcher or
any one rank stops every rank after the same step, with that step's checkpoint, exit code 0; the same
command then resumes, and the trajectory equals the uninterrupted run's bit for bit. A SIGTERM to a
bare OpenMPI `mpirun` does the same within odls_base_sigkill_timeout, mpirun then exiting 1."""
import json
import os
import re
import signal
import subprocess
import threading
import time
import unittest

from common import ENV, ROOT, SHARDLM, main_args, tmpdir
from test_timeout import rank_pids

STEPS = 12
CONFIG = os.path.join(ROOT, "configs", "tiny.json")


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


class Preemption(unittest.TestCase):
    def train(self, out_dir, nproc, extra=()):
        cmd = [SHARDLM, "train", "--config", CONFIG, f"--steps={STEPS}", "--log_interval=1", f"--out_dir={out_dir}",
               "--data.val=", "--checkpoint_interval=0", *(["--nproc", str(nproc)] if nproc > 1 else []), *extra]
        return cmd

    def interrupted(self, nproc, target, sig, extra=()):
        """Runs to step 4, sends `sig` to the launcher (target None) or rank `target`; returns (exit code,
        output, out_dir). Output is read as it comes (nothing can block on a full pipe) and a watchdog
        kills the job should it never stop."""
        out_dir = tmpdir("preempt")
        p = subprocess.Popen(self.train(out_dir, nproc, extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=ENV, cwd=ROOT, start_new_session=True)
        watchdog = threading.Timer(300, lambda: os.killpg(p.pid, signal.SIGKILL))
        watchdog.start()
        seen = []
        try:
            for line in p.stdout:
                seen.append(line)
                if line.startswith("step 4/"):
                    break
            pids = [p.pid] if target is None else rank_pids(target, out_dir)
            self.assertTrue(pids, "process to signal not found")
            for pid in pids:
                os.kill(pid, sig)
            seen.append(p.stdout.read())
            p.wait(timeout=120)
        finally:
            watchdog.cancel()
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return p.returncode, "".join(seen), out_dir

    def check_stop_and_resume(self, nproc, target, sig, extra=()):
        code, out, out_dir = self.interrupted(nproc, target, sig, extra)
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"shardlm: SIG(TERM|USR1) received: stopped after step (\d+) of 12 with its checkpoint saved", out)
        stopped = int(re.search(r"stopped after step (\d+)", out).group(1))
        self.assertLess(stopped, STEPS)
        self.assertTrue(os.path.isdir(os.path.join(out_dir, "checkpoints", f"step-{stopped:06d}")), out)
        self.assertFalse(os.path.exists(os.path.join(out_dir, "model.safetensors")), "a stopped run exports nothing")
        # The same command resumes and finishes; the whole trajectory equals an uninterrupted run's.
        resumed = subprocess.run(self.train(out_dir, nproc, extra), capture_output=True, text=True, env=ENV, cwd=ROOT,
                                 timeout=300)
        self.assertEqual(resumed.returncode, 0, resumed.stdout + resumed.stderr)
        self.assertIn(f"checkpoint of step {stopped} verified and loaded", resumed.stdout + resumed.stderr)
        straight = tmpdir("preempt_straight")
        whole = subprocess.run(self.train(straight, nproc, extra), capture_output=True, text=True, env=ENV, cwd=ROOT,
                               timeout=300)
        self.assertEqual(whole.returncode, 0, whole.stdout + whole.stderr)
        self.assertEqual(losses(out_dir), losses(straight))
        self.assertEqual(len(losses(straight)), STEPS)
        print(f"nproc {nproc}, {signal.Signals(sig).name} to {'the launcher' if target is None else f'rank {target}'}: "
              f"stopped after step {stopped}, resumed to {STEPS}, losses equal to the uninterrupted run's")

    def test_sigterm_to_the_launcher_stops_every_rank_with_a_checkpoint(self):
        # OpenMPI's mpirun kills the ranks about a second after a SIGTERM; the launcher forwards it as
        # SIGUSR1, which mpirun passes on.
        self.check_stop_and_resume(2, None, signal.SIGTERM, ["--zero_optimization.stage=3"])

    def test_sigterm_to_one_rank_stops_them_all(self):
        # As srun delivers it (to every task, or here to one): the ranks agree on the stop step.
        self.check_stop_and_resume(2, 1, signal.SIGTERM)

    def test_sigusr1_to_a_single_process(self):
        self.check_stop_and_resume(1, None, signal.SIGUSR1)

    def test_sigterm_to_a_bare_mpirun_stops_within_the_sigkill_timeout(self):
        # OpenMPI 4.1's mpirun (run by the user, no launcher) cannot forward SIGTERM: it sends the ranks
        # SIGCONT, sleeps odls_base_sigkill_timeout seconds (the recipe raises it from 1 to T), SIGTERM,
        # sleeps T again, SIGKILL, and exits 1 whatever the ranks do (ess_hnp_module.c clean_abort).
        # The ranks stop after their step with its checkpoint and exit 0 before the SIGKILL (a rank
        # waiting in MPI_Finalize would be killed at 2T: mpirun would take >= 2T). Every step is
        # logged, so rank 0's stdout pseudo-terminal fills while mpirun sleeps: the stop must not
        # block on it. The run is long enough (400 steps, ~4 s) that the ranks learn of the stop
        # before its end.
        T, steps = 2, 400
        env = dict(ENV, OMPI_MCA_odls_base_sigkill_timeout=str(T))

        def cmd(out_dir):
            return ["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none", SHARDLM, "train", "--config", CONFIG,
                    f"--steps={steps}", "--log_interval=1", f"--out_dir={out_dir}", "--data.val=",
                    "--checkpoint_interval=0"]

        out_dir = tmpdir("preempt_mpirun")
        p = subprocess.Popen(cmd(out_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             cwd=ROOT, start_new_session=True)
        watchdog = threading.Timer(300, lambda: os.killpg(p.pid, signal.SIGKILL))
        watchdog.start()
        seen = []
        try:
            for line in p.stdout:
                seen.append(line)
                if line.startswith("step 4/"):
                    break
            os.kill(p.pid, signal.SIGTERM)
            sent = time.time()
            seen.append(p.stdout.read())
            p.wait(timeout=120)
            took = time.time() - sent
        finally:
            watchdog.cancel()
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        out = "".join(seen)
        self.assertEqual(p.returncode, 1, out)  # OpenMPI's own exit status for a job it was told to end
        match = re.search(rf"shardlm: SIGTERM received: stopped after step (\d+) of {steps} with its checkpoint saved", out)
        self.assertTrue(match, out[-3000:])
        stopped = int(match.group(1))
        self.assertLess(stopped, steps)
        self.assertTrue(os.path.isdir(os.path.join(out_dir, "checkpoints", f"step-{stopped:06d}")), out[-3000:])
        self.assertFalse(os.path.exists(os.path.join(out_dir, "model.safetensors")), "a stopped run exports nothing")
        self.assertLess(took, 2 * T, "the ranks were SIGKILLed instead of exiting after the checkpoint")
        resumed = subprocess.run(cmd(out_dir), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        self.assertEqual(resumed.returncode, 0, resumed.stdout[-3000:] + resumed.stderr)
        self.assertIn(f"checkpoint of step {stopped} verified and loaded", resumed.stdout + resumed.stderr)
        straight = tmpdir("preempt_mpirun_straight")
        whole = subprocess.run(cmd(straight), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        self.assertEqual(whole.returncode, 0, whole.stdout[-3000:] + whole.stderr)
        self.assertEqual(losses(out_dir), losses(straight))
        self.assertEqual(len(losses(straight)), steps)
        print(f"SIGTERM to a bare mpirun (odls_base_sigkill_timeout={T}): stopped after step {stopped}, mpirun "
              f"exited 1 after {took:.1f} s, resumed to {steps}, losses equal to the uninterrupted run's")


if __name__ == "__main__":
    unittest.main(argv=main_args())
