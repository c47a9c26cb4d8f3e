"""Hybrid sharding from the command line (parallelism.hybrid_shard, DeepSpeed's mics_shard_size;
src/parallel/parallel_dims.h): the run says its groups, the node default on one machine shards over
every rank and says so, the planner plans the bytes between groups, and settings that cannot work are
refused naming the key before anything is written. Its numbers (ZeRO reproduced, memory and bytes
equal to the plan, checkpoints) are tested in tests/mpi/test_zero.cpp and test_checkpoint.cpp."""
import json
import os
import unittest

from common import ROOT, main_args, read_metrics, run, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--steps=2", "--log_interval=100", "--resume=false"]


class HybridShard(unittest.TestCase):
    def test_groups_of_two_on_four_ranks(self):
        d = tmpdir("hybrid")
        code, out, err, _ = run(BASE + ["--nproc", "4", f"--out_dir={d}", "--zero_optimization.stage=3",
                                        "--parallelism.hybrid_shard=true", "--parallelism.shard_group_size=2"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("ZeRO stage 3 in shard groups of 2 x 2 replicas (hybrid)", out)
        m = read_metrics(d)
        self.assertGreater(m[-1]["comm_replica_all_reduce_bytes"], 0)
        self.assertGreater(m[-1]["comm_shard_reduce_scatter_bytes"], 0)
        with open(os.path.join(d, "plan.json")) as f:
            plan = json.load(f)
        self.assertEqual(plan["shard"], 2)
        self.assertEqual(plan["stages"][0]["comm_bytes_per_step"]["replica_all_reduce"],
                         m[-1]["comm_replica_all_reduce_bytes"])

    def test_mics_shard_size_is_hybrid_sharding_at_stage_3_only(self):
        d = tmpdir("mics")
        code, out, err, _ = run(BASE + ["--nproc", "4", f"--out_dir={d}", "--zero_optimization.stage=3",
                                        "--zero_optimization.mics_shard_size=2"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("in shard groups of 2 x 2 replicas (hybrid)", out)
        code, out, err, _ = run(BASE + ["--nproc", "4", f"--out_dir={d}_2", "--zero_optimization.stage=2",
                                        "--zero_optimization.mics_shard_size=2"])
        self.assertNotEqual(code, 0)
        self.assertIn("zero_optimization.mics_shard_size = 2 needs ZeRO stage 3", err)
        self.assertFalse(os.path.exists(d + "_2"))

    def test_the_node_default_on_one_machine_shards_over_every_rank(self):
        d = tmpdir("hybrid_node")
        code, out, err, _ = run(BASE + ["--nproc", "2", f"--out_dir={d}", "--zero_optimization.stage=2",
                                        "--parallelism.hybrid_shard=true"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("one shard group holds all 2 data-parallel ranks (one node)", out)
        self.assertNotIn("(hybrid)", out)

    def test_settings_that_cannot_work_are_refused(self):
        d = os.path.join(tmpdir("hybrid_bad"), "run")
        cases = [
            (["--nproc", "4", "--zero_optimization.stage=3", "--parallelism.hybrid_shard=true",
              "--parallelism.shard_group_size=3"], "a shard group of 3 data-parallel ranks does not divide the 4"),
            (["--nproc", "2", "--parallelism.hybrid_shard=true", "--parallelism.shard_group_size=1"],
             "parallelism.hybrid_shard needs ZeRO stage 1, 2 or 3"),
            (["--nproc", "2", "--zero_optimization.stage=3", "--parallelism.shard_group_size=1"],
             "is set without parallelism.hybrid_shard"),
        ]
        for flags, message in cases:
            code, out, err, _ = run(BASE + [f"--out_dir={d}", *flags])
            self.assertNotEqual(code, 0, flags)
            self.assertIn(message, err, flags)
            self.assertFalse(os.path.exists(d), flags)

    def test_the_planner_plans_the_bytes_between_groups(self):
        code, out, err, _ = run(["plan", "--model", "llama-7b", "--devices", "16", "--shard", "8", "--zero-stage", "3",
                                 "--json"])
        self.assertEqual(code, 0, out + err)
        plan = json.loads(out)
        comm = plan["stages"][0]["comm_bytes_per_step"]
        self.assertEqual(plan["shard"], 8)
        self.assertIn("replica_all_reduce", comm)
        self.assertIn("shard_reduce_scatter", comm)
        # Each rank's 1/8 gradient shard in fp32 (grad_accum_dtype): twice the bf16 bytes of 1/8 of the
        # model the reduce-scatter hands in (up to the units' padding).
        self.assertAlmostEqual(comm["replica_all_reduce"], comm["shard_reduce_scatter"] / 8 * 2,
                               delta=comm["replica_all_reduce"] * 1e-3)
        code, out, err, _ = run(["plan", "--model", "llama-7b", "--devices", "16", "--shard", "3"])
        self.assertNotEqual(code, 0)
        self.assertIn("a shard group of 3 data-parallel ranks must divide the 16", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
