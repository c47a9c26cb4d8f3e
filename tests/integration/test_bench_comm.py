"""`shardlm bench comm`: the nccl-tests-style table and its JSON — every operation (all_to_all too) at every size,
positive times, busbw = algbw x nccl-tests' factor, a memcpy ceiling — with no performance
thresholds (the machines are shared and noisy)."""
import json
import os
import unittest

from common import main_args, run, tmpdir

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
SIZES = [4096 * 4 ** k for k in range(5)]  # 4K .. 1M


def factor(op, n):
    # nccl-tests' doc/PERFORMANCE.md: alltoall moves (n-1)/n of each rank's buffer over the bus.
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
            "all_to_all": (n - 1) / n}.get(op, 1.0)


class BenchComm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.json_path = os.path.join(tmpdir("bench_comm"), "comm.json")
        cls.rc, cls.out, cls.err, cls.secs = run(
            ["bench", "comm", "--nproc", "2", "--max-bytes", "1MiB", "--iters", "3", "--json", cls.json_path],
            timeout=300)
        cls.result = None
        if cls.rc == 0 and os.path.exists(cls.json_path):
            with open(cls.json_path) as f:
                cls.result = json.load(f)

    def setUp(self):
        self.assertEqual(self.rc, 0, f"stdout:\n{self.out}\nstderr:\n{self.err}")
        self.assertIsNotNone(self.result)

    def test_every_op_at_every_size(self):
        r = self.result
        self.assertEqual(r["nranks"], 2)
        self.assertEqual(r["dtype"], "float32")
        got = {(row["op"], row["size_bytes"]) for row in r["results"]}
        self.assertEqual(got, {(op, s) for op in OPS for s in SIZES})
        self.assertEqual(len(r["results"]), len(OPS) * len(SIZES))

    def test_times_bandwidths_and_factors(self):
        n = self.result["nranks"]
        for row in self.result["results"]:
            what = f"{row['op']} {row['size_bytes']} B"
            self.assertGreater(row["time_us"], 0, what)
            self.assertEqual(row["iters"], 3, what)
            self.assertEqual(row["wrong"], 0, what)
            self.assertEqual(row["count"] * 4, row["size_bytes"], what)
            algbw = row["size_bytes"] / (row["time_us"] * 1e-6) / 1e9
            self.assertAlmostEqual(row["algbw_gbps"], algbw, delta=1e-9 * algbw + 1e-12, msg=what)
            self.assertAlmostEqual(row["bus_factor"], factor(row["op"], n), places=12, msg=what)
            self.assertAlmostEqual(row["busbw_gbps"], row["algbw_gbps"] * factor(row["op"], n),
                                   delta=1e-9 * row["busbw_gbps"] + 1e-12, msg=what)
            self.assertGreater(row["memcpy_gbps"], 0, what)  # the row's own, interleaved memcpy
            self.assertAlmostEqual(row["busbw_over_memcpy"], row["busbw_gbps"] / row["memcpy_gbps"],
                                   delta=1e-9 * row["busbw_over_memcpy"] + 1e-12, msg=what)
            self.assertGreater(row["memcpy_share_gbps"], 0, what)  # every rank copying at once
            self.assertAlmostEqual(row["busbw_over_memcpy_share"], row["busbw_gbps"] / row["memcpy_share_gbps"],
                                   delta=1e-9 * row["busbw_over_memcpy_share"] + 1e-12, msg=what)

    def test_memcpy_ceiling(self):
        m = self.result["memcpy"]
        self.assertEqual(m["bytes"], SIZES[-1])
        self.assertGreater(m["gbps"], 0)
        self.assertGreater(m["time_us"], 0)
        self.assertAlmostEqual(m["traffic_gbps"], 2 * m["gbps"], delta=1e-9 * m["gbps"])
        self.assertGreater(m["concurrent_gbps_total"], 0)
        self.assertEqual(self.result["memcpy_ceiling_gbps"], m["gbps"])

    def test_printed_table(self):
        lines = self.out.splitlines()
        headers = [l for l in lines if l.startswith("#") and all(
            w in l for w in ("size", "count", "type", "time", "algbw", "busbw"))]
        self.assertEqual(len(headers), len(OPS), self.out)  # one table per operation
        for op in OPS:
            self.assertIn(f"# {op}:", self.out)
        self.assertIn("# memcpy (ceiling):", self.out)
        self.assertIn("# Out of bounds values : 0 OK", self.out)
        self.assertIn("# busbw / memcpy share", self.out)
        # Only rank 0 prints: one row per op and size.
        rows = [l.split() for l in lines if l and not l.startswith("#")]
        table_rows = [r for r in rows if len(r) == 11]
        self.assertEqual(len(table_rows), len(OPS) * len(SIZES), self.out)
        for r in table_rows:
            self.assertEqual(r[2], "float")
            self.assertGreater(float(r[6]), 0)

    def test_nonblocking_calls_on_four_ranks_are_checked_too(self):
        # The _async forms polled with test() (the trainer's way), on 4 ranks: the shared-memory
        # path's rounds and slices at a size that is not a multiple of the ranks' chunks.
        path = os.path.join(tmpdir("bench_comm_nb"), "comm.json")
        rc, out, err, _ = run(["bench", "comm", "--nproc", "4", "--min-bytes", "12K", "--max-bytes", "12K",
                               "--iters", "2", "--nonblocking", "--json", path], timeout=300)
        self.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.assertIn("non-blocking", out)
        with open(path) as f:
            r = json.load(f)
        self.assertTrue(r["nonblocking"])
        self.assertEqual(r["nranks"], 4)
        self.assertEqual({row["op"] for row in r["results"]}, set(OPS))
        self.assertTrue(all(row["wrong"] == 0 for row in r["results"]), r["results"])

    def test_bad_arguments_fail_before_launching(self):
        for args, words in ((["--dtype", "int8"], "--dtype"), (["--max-bytes", "4X"], "unknown unit"),
                            (["--min-bytes", "1MiB", "--max-bytes", "4KiB"], "below --min-bytes"),
                            (["--ops", "all_to_some"], "unknown operation")):
            rc, out, err, _ = run(["bench", "comm", "--nproc", "2"] + args, timeout=60)
            self.assertNotEqual(rc, 0, args)
            self.assertIn(words, err, args)


if __name__ == "__main__":
    unittest.main(argv=main_args())
