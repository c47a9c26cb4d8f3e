"""flight_recorder.enabled (comm/flight_recorder.h): a run with the recorder off trains the same
losses as one with it on, leaves no flight_recorder folder, records no flight_records column, and
`shardlm diagnose` on it says the recorder was off. A run with it on counts its records per step in
metrics.jsonl (what bench/flight_recorder_cost.py multiplies by one record's cost)."""
import os
import unittest

from common import ROOT, main_args, read_metrics, run, step_losses, tmpdir


def train(out_dir, *flags):
    return run(["train", "--config", os.path.join(ROOT, "configs", "tiny.json"), "--nproc", "2", "--steps=4",
                "--data.val=", "--zero_optimization.stage=3", f"--out_dir={out_dir}", *flags], timeout=300)


class FlightRecorderKey(unittest.TestCase):
    def test_off_trains_the_same_and_writes_nothing(self):
        on, off = tmpdir("fr_on"), tmpdir("fr_off")
        code, out, err, _ = train(on)
        self.assertEqual(code, 0, out + err)
        code, out, err, _ = train(off, "--flight_recorder.enabled=false")
        self.assertEqual(code, 0, out + err)
        self.assertEqual(step_losses(on), step_losses(off))  # bit for bit, NaN included
        self.assertEqual(len(step_losses(off)), 4)
        self.assertFalse(os.path.exists(os.path.join(off, "flight_recorder")), os.listdir(off))
        self.assertTrue(all("flight_records" not in r for r in read_metrics(off)))
        # With it on, every step counts what it recorded: ZeRO-3 gathers and reduce-scatters per unit.
        counts = [r["flight_records"] for r in read_metrics(on)]
        self.assertEqual(len(counts), 4)
        self.assertTrue(all(c >= 4 for c in counts[1:]), counts)
        self.assertEqual(len(set(counts[1:])), 1, counts)  # the same calls each step after the first

        code, out, err, _ = run(["diagnose", off], timeout=60)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("the flight recorder was off in this run (flight_recorder.enabled is false", err)
        self.assertIn("flight_recorder.enabled true", err)

    def test_key_is_checked(self):
        d = tmpdir("fr_bad")
        code, out, err, _ = train(d, "--flight_recorder.enabled=3")
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("flight_recorder.enabled", err)
        code, out, err, _ = train(d, "--flight_recorder.entries=10")
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("Valid keys in flight_recorder: enabled", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
