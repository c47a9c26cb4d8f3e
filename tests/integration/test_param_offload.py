"""NVMe parameter offload at ZeRO stage 3 (zero_optimization.offload_param.device "nvme";
src/parallel/zero/param_offload.h): every sharded unit's compute shard lives in a file under nvme_path,
is read into its gather buffer ahead of the gather and written back by the optimizer step. Proven
against the same run without offload, which is the reference: losses and grad norms bit for bit on 1
rank in fp32 and 2 ranks in bf16, each with and without optimizer offload (the runs are few: CI time);
memory.json moves exactly the parameter shards' bytes to
"offloaded" and equals plan.json key by key; checkpoints written from the files equal those written from
memory byte for byte and reshard to 1 rank; a bad nvme_path or a stage below 3 stops before training
naming the key and the fix."""
import json
import os
import unittest

from common import ROOT, TrainsTheBase, main_args, read_bytes, run, step_losses, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--log_interval=100", "--resume=false",
        "--zero_optimization.stage=3", "--zero_optimization.stage3_param_persistence_threshold=0",
        "--zero_optimization.stage3_prefetch_bucket_size=200000"]  # a window of one or two units


def params_off(path, *extra):
    # max_in_cpu 0: every sharded unit to disk (DeepSpeed's default 1e9 would keep the tiny model in memory);
    # buffer_count 2 makes the step's read-ahead wait on its own writes.
    return ["--zero_optimization.offload_param.device=nvme", f"--zero_optimization.offload_param.nvme_path={path}",
            "--zero_optimization.offload_param.max_in_cpu=0", "--zero_optimization.offload_param.buffer_count=2",
            *extra]


def states_off(path):
    return ["--zero_optimization.offload_optimizer.device=nvme",
            f"--zero_optimization.offload_optimizer.nvme_path={path}", "--zero_optimization.sub_group_size=20000"]


def memory(d, name="memory.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


class ParamOffload(TrainsTheBase, unittest.TestCase):
    BASE = BASE
    STEPS = 3

    def test_losses_are_bit_identical_and_the_bytes_leave_memory_json_and_the_plan_alike(self):
        nvme = tmpdir("pnvme")
        # Two references (1 rank fp32, 2 ranks bf16), each against parameter offload alone and with the
        # optimizer states offloaded too: 6 runs cover ranks, precision and optimizer offload.
        plain = {}
        for nproc, bf16 in ((1, False), (2, True)):
            plain[nproc, bf16] = tmpdir("pplain")
            self.train(plain[nproc, bf16], f"--bf16.enabled={'true' if bf16 else 'false'}", nproc=nproc)
        cases = [(1, False, False), (1, False, True), (2, True, False), (2, True, True)]
        for nproc, bf16, with_states in cases:
            with self.subTest(nproc=nproc, bf16=bf16, states=with_states):
                off = tmpdir("poff")
                extra = states_off(nvme) if with_states else []
                out = self.train(off, f"--bf16.enabled={'true' if bf16 else 'false'}", *params_off(nvme), *extra,
                                 nproc=nproc)
                self.assertIn(f"parameters ", out)
                self.assertIn(f"on NVMe at {nvme} (", out)
                # The startup line carries the strategy's whole description, parameter offload last (a
                # fixed 512-byte buffer once cut it short with both offloads on).
                line = next(x for x in out.splitlines() if x.startswith("shardlm: model "))
                self.assertTrue(line.endswith("the step streams them through 2 buffers"), line)
                self.assertIn("4 of 4 unit shards", out)
                ref = plain[nproc, bf16]
                self.assertEqual(step_losses(ref), step_losses(off))
                self.assertEqual(read_bytes(os.path.join(ref, "model.safetensors")),
                                 read_bytes(os.path.join(off, "model.safetensors")))
                before, after, plan = memory(ref), memory(off), memory(off, "plan.json")["stages"][0]
                moved = before["compute_params"] - after["compute_params"]
                self.assertGreater(moved, 0)
                # The parameter shards: with every unit sharded and offloaded, no compute parameter stays.
                self.assertEqual(after["compute_params"], 0)
                states = before["master_params"] + before["optimizer_states"] if with_states else 0
                self.assertEqual(after["offloaded"], moved + states)
                self.assertEqual(after["total_model_states"], before["total_model_states"] - after["offloaded"])
                for key in ("compute_params", "gradients", "master_params", "optimizer_states", "offloaded",
                            "total_model_states"):
                    self.assertEqual(after[key], plan[key], key)
        self.assertEqual(os.listdir(nvme), [], "the parameter files outlive the run")

    def test_8bit_moments_with_blocks_shared_between_ranks(self):
        # fp32 on 2 ranks: the shards are the masters, and the shared 8-bit blocks read them before any
        # piece steps, so the step pages every shard in first (with and without optimizer offload).
        nvme = tmpdir("pnvme8")
        flags = ["--optimizer.state_precision=8bit", "--optimizer.min_8bit_size=1"]
        plain, off, both = tmpdir("p8plain"), tmpdir("p8off"), tmpdir("p8both")
        self.train(plain, *flags)
        self.train(off, *flags, *params_off(nvme))
        self.train(both, *flags, *params_off(nvme), *states_off(nvme))
        self.assertEqual(step_losses(plain), step_losses(off))
        self.assertEqual(step_losses(plain), step_losses(both))

    def test_checkpoints_equal_those_without_offload_and_reshard_to_one_rank(self):
        nvme = tmpdir("pnvme_ckpt")
        flags = ["--bf16.enabled=true", "--checkpoint_interval=2"]
        plain, off = tmpdir("pckpt_plain"), tmpdir("pckpt_off")
        self.train(plain, *flags, steps=2)
        self.train(off, *flags, *params_off(nvme), steps=2)
        for rank in ("rank-00000", "rank-00001"):
            shard = os.path.join("checkpoints", "step-000002", rank + ".safetensors")
            self.assertEqual(read_bytes(os.path.join(plain, shard)), read_bytes(os.path.join(off, shard)), rank)
        # Written without offload, resumed on 1 rank with it (the shards read from the checkpoint go to the
        # files); written from the files, resumed on 1 rank without it: the same losses either way.
        for d, extra in ((plain, params_off(nvme)), (off, [])):
            code, out, err, _ = run(BASE + ["--nproc", "1", f"--out_dir={d}", *flags, "--resume=true", "--steps=4",
                                            *extra])
            self.assertEqual(code, 0, out + err)
            self.assertIn("resumed from", out + err)
        self.assertEqual(step_losses(plain), step_losses(off))

    def test_bad_nvme_path_or_stage_stops_before_training(self):
        base = tmpdir("pnvme_bad")
        missing = os.path.join(base, "missing")
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={base}/r1", *params_off(missing)])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn(f"zero_optimization.offload_param.nvme_path = '{missing}' does not exist", err)
        self.assertNotIn("step 1/", out)
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={base}/r2",
                                        "--zero_optimization.stage=2", *params_off(base)])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("zero_optimization.offload_param.device = \"nvme\" needs ZeRO stage 3", err)
        self.assertIn("set zero_optimization.stage to 3", err)
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=2", f"--out_dir={base}/r3",
                                        *params_off(base, "--zero_optimization.offload_param.buffer_size=1000")])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("zero_optimization.offload_param.buffer_size = 1000 elements is smaller than the shard", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
