"""DeepSpeed's monitor keys (docs/monitoring.md): `tensorboard` writes TensorBoard event files and
`csv_monitor` DeepSpeed's CSV files, read back here with the pinned `tensorboard` package's own
EventAccumulator (size_guidance keeping every scalar). Every numeric metrics.jsonl field is a scalar at
its step with the same value as a float32, and a CSV row with the same double. After a kill -9 and a
resume, TensorBoard's view of the directory (its purge of orphaned data included) holds every step once,
with the resumed run's values, and the CSV files match metrics.jsonl again. Bad output paths and job
names stop the run before training with one message naming the key and the fix. `report --watch`
rewrites the report while a run trains: headless Chromium sees more steps on a second load."""
import fcntl
import math
import os
import re
import signal
import socket
import struct
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, kill_session, main_args, read_bytes, read_metrics, run, tmpdir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TINY = os.path.join(ROOT, "configs", "tiny.json")
HF_TAGS = {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm", "val_loss": "eval/loss"}


def tag_of(field):
    return HF_TAGS.get(field, "train/" + field)


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def fields(records):
    """{field: {step: value}} of every numeric metrics.jsonl field (None where the record holds null)."""
    out = {}
    for r in records:
        for k, v in r.items():
            if k != "step" and (v is None or isinstance(v, (int, float))):
                out.setdefault(k, {})[r["step"]] = v
    return out


def scalars(logdir):
    """{tag: [(step, value), ...]} as TensorBoard shows the directory (orphaned data purged)."""
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wait_unlocked(out_dir, deadline):
    """The ranks of a killed job die after its launcher: wait until none holds out_dir's lock."""
    with open(os.path.join(out_dir, ".lock"), "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.time() < deadline, "a killed rank still holds out_dir"
                time.sleep(0.05)


class Monitors(unittest.TestCase):
    def train(self, d, *flags, steps=6):
        code, out, err, _ = run(["train", "--config", TINY, f"--steps={steps}", f"--out_dir={d}", *flags])
        self.assertEqual(code, 0, out + err)
        return out + err

    def check_tensorboard(self, view, records):
        """Every numeric field at each of its steps once, equal as float32; no other tag with points (a
        tag whose points were all purged stays listed, empty: checkpoint_stall_s of a killed run)."""
        expected = fields(records)
        view = {tag: points for tag, points in view.items() if points}
        self.assertEqual(sorted(view), sorted(tag_of(k) for k in expected))
        for field, by_step in expected.items():
            got = view[tag_of(field)]
            self.assertEqual([s for s, _ in got], sorted(by_step), f"{field}: steps in TensorBoard")
            for step, value in got:
                want = by_step[step]
                if want is None or math.isnan(want):
                    self.assertTrue(math.isnan(value), f"{field} at step {step}: {value} for null")
                else:
                    self.assertEqual(value, f32(want), f"{field} at step {step}")

    def check_csv(self, csv_dir, records):
        """One file per tag ('/' -> '_'), a `step,<last part>` header, rows equal to metrics.jsonl."""
        expected = fields(records)
        files = set(os.listdir(csv_dir))
        for name in files - {tag_of(k).replace("/", "_") + ".csv" for k in expected}:
            with open(os.path.join(csv_dir, name)) as f:  # a killed run's tag the resumed run never wrote
                self.assertEqual(len(f.read().splitlines()), 1, f"{name}: rows past the resumed step")
        self.assertLessEqual({tag_of(k).replace("/", "_") + ".csv" for k in expected}, files)
        for field, by_step in expected.items():
            tag = tag_of(field)
            with open(os.path.join(csv_dir, tag.replace("/", "_") + ".csv")) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], "step," + tag.split("/")[-1])
            rows = [line.split(",") for line in lines[1:]]
            self.assertEqual([int(s) for s, _ in rows], sorted(by_step), f"{field}: steps in the CSV file")
            for s, v in rows:
                want = by_step[int(s)]
                if want is None:
                    self.assertEqual(v, "nan")
                else:
                    self.assertEqual(float(v), want, f"{field} at step {s}")  # the same double, no rounding

    def test_every_metric_is_a_scalar_and_a_csv_row_at_its_step(self):
        tmp = tmpdir("monitors")
        d, tb, csv = os.path.join(tmp, "run"), os.path.join(tmp, "tb"), os.path.join(tmp, "csv")
        out = self.train(d, "--tensorboard.enabled=true", f"--tensorboard.output_path={tb}",
                         "--tensorboard.job_name=exp1/run1", "--csv_monitor.enabled=true",
                         f"--csv_monitor.output_path={csv}", "--eval_interval=3")
        records = read_metrics(d)
        self.assertEqual([r["step"] for r in records], list(range(1, 7)))
        self.assertIn("val_loss", records[2])
        logdir = os.path.join(tb, "exp1", "run1")  # job_name nests folders, as DeepSpeed's os.path.join does
        files = os.listdir(logdir)
        self.assertEqual(len(files), 1, files)
        self.assertRegex(files[0], r"^events\.out\.tfevents\.\d{10}\." + re.escape(socket.gethostname()) + r"\.\d+\.0$")
        view = scalars(logdir)
        self.check_tensorboard(view, records)
        self.assertIn("train/time_forward_s", view)
        self.assertIn("train/tokens_per_s", view)
        self.check_csv(os.path.join(csv, "DeepSpeedJobName"), records)  # csv_monitor.job_name's default
        self.assertNotIn("tensorboard.enabled", out, "a key shardlm honours gets no notice")

    def test_default_directory_is_deepspeedjobname_in_the_working_directory(self):
        tmp = tmpdir("monitors_default")
        d = os.path.join(tmp, "run")
        p = subprocess.run([SHARDLM, "train", "--config", TINY, "--steps=2", f"--out_dir={d}",
                            f"--data.train={ROOT}/data/brown/train.bin", f"--data.val={ROOT}/data/brown/val.bin",
                            "--tensorboard.enabled=true"], capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.check_tensorboard(scalars(os.path.join(tmp, "DeepSpeedJobName")), read_metrics(d))

    def test_kill9_and_resume_show_every_step_once(self):
        tmp = tmpdir("monitors_kill")
        d, tb, csv = os.path.join(tmp, "run"), os.path.join(tmp, "tb"), os.path.join(tmp, "csv")
        # An endless run with a checkpoint at step 10, killed at about step 12, so steps 11 and 12 are
        # written twice: by the killed run (orphans, which TensorBoard must drop) and by the resumed one,
        # which stops at step 16.
        steps = 16
        flags = ["--checkpoint_interval=10", "--tensorboard.enabled=true", f"--tensorboard.output_path={tb}",
                 "--csv_monitor.enabled=true", f"--csv_monitor.output_path={csv}", "--eval_interval=4"]
        p = subprocess.Popen([SHARDLM, "train", "--config", TINY, "--steps=1000000", f"--out_dir={d}", *flags],
                             env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        deadline = time.time() + 300
        metrics = os.path.join(d, "metrics.jsonl")
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(metrics) and len(read_bytes(metrics).splitlines()) >= 12:
                break
            time.sleep(0.02)
        kill_session(p.pid)
        p.wait(timeout=60)
        wait_unlocked(d, deadline + 60)
        self.assertGreaterEqual(len(read_metrics(d)), 12, "the job ended before it was killed")
        logdir = os.path.join(tb, "DeepSpeedJobName")
        old = {f: read_bytes(os.path.join(logdir, f)) for f in os.listdir(logdir)}
        self.assertEqual(len(old), 1)
        before = [s for s, _ in scalars(logdir)["train/loss"]]  # (the kill may cut the last step's flush)
        self.assertEqual(before, list(range(1, len(before) + 1)))

        out = self.train(d, *flags, steps=steps)  # the same command: resumes from the newest checkpoint
        self.assertIn("resumed from", out)
        resumed_at = int(re.search(r"resumed from .* after step (\d+)", out).group(1))
        self.assertLess(resumed_at, before[-1], "no event was written past the checkpoint: nothing to purge")
        records = read_metrics(d)
        self.assertEqual([r["step"] for r in records], list(range(1, steps + 1)))
        for f, data in old.items():
            self.assertEqual(read_bytes(os.path.join(logdir, f)), data, "the killed run's event file changed")
        self.assertEqual(len(os.listdir(logdir)), 2, "the resumed run writes a new event file beside the old one")
        self.check_tensorboard(scalars(logdir), records)  # each step once, the resumed run's values
        self.check_csv(os.path.join(csv, "DeepSpeedJobName"), records)

    def expect_refused(self, flags, *needles):
        tmp = tmpdir("monitors_bad")
        d = os.path.join(tmp, "run")
        code, out, err, _ = run(["train", "--config", TINY, "--steps=2", f"--out_dir={d}", *flags], timeout=120)
        self.assertNotEqual(code, 0, out + err)
        errors = [line for line in err.splitlines() if "error:" in line]
        self.assertEqual(len(errors), 1, err)
        for n in needles:
            self.assertIn(n, errors[0])
        self.assertNotIn("internal error", err)
        self.assertFalse(os.path.exists(os.path.join(d, "metrics.jsonl")), "training started")

    def test_bad_output_path_or_job_name_is_refused_before_training(self):
        ro = "/proc/sys"  # read-only even for root
        self.expect_refused(["--tensorboard.enabled=true", f"--tensorboard.output_path={ro}/tb"],
                            "tensorboard.output_path", "is not writable", "choose a writable tensorboard.output_path")
        self.expect_refused(["--csv_monitor.enabled=true", f"--csv_monitor.output_path={ro}/csv"],
                            "csv_monitor.output_path", "choose a writable csv_monitor.output_path")
        tmp = tmpdir("monitors_climb")
        self.expect_refused(["--tensorboard.enabled=true", f"--tensorboard.output_path={tmp}",
                             "--tensorboard.job_name=runs/../../elsewhere"], "tensorboard.job_name", "'..'",
                            "name a folder inside it")
        self.expect_refused(["--csv_monitor.enabled=true", "--csv_monitor.job_name=/abs/run"], "csv_monitor.job_name",
                            "absolute path")
        self.assertEqual(os.listdir(tmp), [], "a refused run created a folder")

    def test_wandb_and_comet_are_noted_and_point_at_tensorboard(self):
        tmp = tmpdir("monitors_wandb")
        out = self.train(os.path.join(tmp, "run"), "--wandb.enabled=true", "--comet.enabled=true", steps=1)
        wandb = [line for line in out.splitlines() if "wandb.enabled" in line]
        self.assertEqual(len(wandb), 1, out)
        self.assertIn("not written", wandb[0])
        self.assertIn("wandb sync --sync-tensorboard", wandb[0])
        comet = [line for line in out.splitlines() if "comet.enabled" in line]
        self.assertEqual(len(comet), 1, out)
        self.assertIn("tensorboard.enabled", comet[0])



class ReportWatch(unittest.TestCase):
    """`shardlm report RUN --watch 1` during a run: headless Chromium (test_report's helper) loads the
    page twice and sees more steps the second time; the watcher stops by itself when the run ends, and on
    SIGINT. The run is endless and stopped with SIGTERM (train/preemption.h: a clean stop after the
    step), so that the test does not depend on how fast this machine trains."""

    def records_on_page(self, page):
        from test_report import chromium
        p = chromium(["--dump-dom", "file://" + page])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("<title>report-ok</title>", p.stdout, "the page's check script found a problem")
        return int(re.search(r"\((\d+) records;", p.stdout).group(1)), p.stdout

    def test_watch_rewrites_the_report_while_the_run_trains(self):
        from test_report import chromium_binary
        chromium_binary()
        tmp = tmpdir("watch")
        d, page = os.path.join(tmp, "run"), os.path.join(tmp, "live.html")
        train = subprocess.Popen([SHARDLM, "train", "--config", TINY, "--steps=1000000", f"--out_dir={d}",
                                  "--eval_interval=50", "--checkpoint_interval=0"], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        metrics = os.path.join(d, "metrics.jsonl")
        lines = lambda: len(read_bytes(metrics).splitlines()) if os.path.exists(metrics) else 0  # noqa: E731
        watch = other = None
        try:
            deadline = time.time() + 120
            while lines() < 2:
                self.assertIsNone(train.poll(), "the run ended early")
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            watch = subprocess.Popen([SHARDLM, "report", d, "--watch", "1", "--out", page], env=ENV, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while not os.path.exists(page):
                self.assertLess(time.time(), deadline, "no page written")
                time.sleep(0.05)
            first, dom = self.records_on_page(page)
            self.assertIn('http-equiv="refresh" content="1"', dom, "a live page reloads itself")
            while lines() < first + 3:
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            time.sleep(2.5)  # two rewrites, at least one after those steps
            self.assertIsNone(train.poll(), "the run ended before the second load")
            second, _ = self.records_on_page(page)
            self.assertGreater(second, first)

            # A second watcher stops on SIGINT, leaving a page that no longer reloads.
            other_page = os.path.join(tmp, "other.html")
            other = subprocess.Popen([SHARDLM, "report", d, "--watch", "1", "--out", other_page], env=ENV, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while not os.path.exists(other_page):
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            other.send_signal(signal.SIGINT)
            out, _ = other.communicate(timeout=60)
            self.assertEqual(other.returncode, 0, out)
            self.assertIn("stopped by SIGINT", out)
            self.assertIsNone(train.poll(), "the run ended before the SIGINT check")
            with open(other_page) as f:
                self.assertNotIn("http-equiv=\"refresh\"", f.read())

            train.send_signal(signal.SIGTERM)  # the run ends: a checkpoint of its step, exit 0
            self.assertEqual(train.wait(timeout=300), 0)
            out, _ = watch.communicate(timeout=60)  # stops by itself once the run has released out_dir
            self.assertEqual(watch.returncode, 0, out)
            self.assertIn("the run is not running", out)
            final, dom = self.records_on_page(page)
            self.assertEqual(final, len(read_metrics(d)))
            self.assertNotIn("http-equiv=\"refresh\"", dom)
        finally:
            for p in (watch, other):
                if p and p.poll() is None:
                    p.kill()
                    p.communicate()
            if train.poll() is None:
                kill_session(train.pid)
                train.wait()


if __name__ == "__main__":
    unittest.main(argv=main_args())
