"""`plan --search` with NVMe offload, end to end (issues 24 and 26): offloaded layouts are listed with
the device and disk bytes `plan` gives the same layout, ranked by predicted time, so offload is first only
under a device memory nothing else fits, and the emitted config then offloads and trains; a profile
measured before the disk was leaves offload out, saying which field is missing and how to measure it.
The profile is written here (every rate flat) so that no measurement runs: cheap, and deterministic."""
import json
import os
import unittest

from common import main_args, read_bytes, read_metrics, run, tmpdir

COMMON = ["--model", "tiny", "--devices", "1", "--seq-len", "32", "--precision", "fp32"]
TINY = COMMON + ["--micro-batch", "2"]


def profile(disk):
    p = {"description": "flat test profile", "device": "cpu", "threads": 1, "ranks": 1,
         "gemm": [{"dtype": "fp32", "m": 64, "n": 64, "k": 64, "flops_per_s": 1e9}],
         "attention_forward": {"fp32": 1e9}, "attention_backward": {"fp32": 1e9},
         "stream_bytes_per_s": 1e10, "optimizer_elements_per_s": 1e8, "collectives": [], "overlap": 0}
    if disk:
        p.update({"disk_dir": disk, "disk_io_path": "O_DIRECT",
                  "disk": [{"block_bytes": 1 << 20, "disk_write_bytes_per_s": 1e9, "disk_read_bytes_per_s": 1e9}]})
    return p


class PlanSearchOffload(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tmpdir("search_offload")
        cls.nvme = os.path.join(cls.dir, "nvme")
        os.makedirs(cls.nvme)
        cls.machine = os.path.join(cls.dir, "machine.json")
        with open(cls.machine, "w") as f:
            json.dump(profile(cls.nvme), f)

    def search(self, *extra, machine=None):
        code, out, err, _ = run(["plan", *TINY, "--search", "--json", "--machine", machine or self.machine, *extra])
        self.assertEqual(code, 0, out + err)
        return json.loads(out)

    def test_offload_wins_only_where_nothing_else_fits_and_its_bytes_are_plans(self):
        found = self.search()["fitting"]
        self.assertEqual(found[0]["offload"], "none")
        plain = min(c["bytes_per_rank"] for c in found if c["offload"] == "none")
        offloaded = [c for c in found if c["offload"] != "none"]
        self.assertTrue(offloaded)
        for c in offloaded:  # slower than the same layout without offload: the disk costs time
            self.assertGreater(c["disk_bytes_per_rank"], 0)
            self.assertGreater(c["predicted"]["offload_exposed_s"], 0)
        # Only offloaded layouts fit: the fastest of them is first, and --emit-config offloads.
        cfg = os.path.join(self.dir, "offloaded.json")
        tight = self.search("--device-memory", str(plain - 1), "--emit-config", cfg)["fitting"]
        self.assertTrue(tight)
        self.assertTrue(all(c["offload"] != "none" for c in tight))
        times = [c["predicted"]["step_s"] for c in tight]
        self.assertEqual(times, sorted(times))
        best = tight[0]
        self.assertEqual(best["offload"], "states nvme")
        emitted = json.loads(read_bytes(cfg))
        self.assertEqual(emitted["zero_optimization"]["offload_optimizer"], {"device": "nvme", "nvme_path": self.nvme})
        self.assertEqual(emitted["zero_optimization"]["stage"], best["zero_stage"])
        # `plan` for the same layout gives the listed bytes.
        code, out, err, _ = run(["plan", *COMMON, "--json", "--zero-stage", str(best["zero_stage"]),
                                 "--micro-batch", str(best["micro_batch"]), "--accumulation", str(best["accumulation"]),
                                 "--recompute", best["recompute"], "--offload-optimizer", "nvme"])
        self.assertEqual(code, 0, out + err)
        stage = json.loads(out)["stages"][0]
        self.assertEqual(stage["total"], best["bytes_per_rank"])
        self.assertEqual(stage["offloaded"], best["disk_bytes_per_rank"])
        # The emitted config trains with its states on disk (the tiny preset's vocabulary is the Brown tokenizer's).
        d = os.path.join(self.dir, "run")
        code, out, err, _ = run(["train", "--config", cfg, "--steps=1", "--data.val=", f"--out_dir={d}",
                                 "--model.vocab_size=4096", "--threads=1"], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertIn("on NVMe at " + self.nvme, out + err)
        self.assertEqual([m["step"] for m in read_metrics(d)], [1])

    def test_a_profile_without_the_disk_leaves_offload_out_and_says_why(self):
        old = os.path.join(self.dir, "old_machine.json")
        with open(old, "w") as f:
            json.dump(profile(None), f)
        result = self.search(machine=old)
        self.assertTrue(result["fitting"])
        self.assertTrue(all(c["offload"] == "none" for c in result["fitting"]))
        self.assertEqual(len(result["notes"]), 1)
        self.assertIn("disk_read_bytes_per_s", result["notes"][0])
        self.assertIn("shardlm bench machine --disk DIR", result["notes"][0])
        code, out, err, _ = run(["plan", *TINY, "--zero-stage", "1", "--offload-optimizer", "nvme", "--machine", old])
        self.assertNotEqual(code, 0, out)
        self.assertIn("disk_read_bytes_per_s", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
