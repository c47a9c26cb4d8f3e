"""ZeRO-Offload's optimizer half on a CPU run (zero_optimization.offload_optimizer.device "cpu";
src/parallel/zero/host_optimizer.h): at ZeRO stages 1-3 the step runs through the host optimizer, the
shard cut into sub_group_size chunks and each chunk's pieces stepped by CPU threads, sharing the
engine's own AdamW (its masters and gradient views used in place). The same run without offload is the
reference: losses, grad norms and final weights bit for bit on 1 and 2 ranks at stages 1-3 in fp32 and
bf16; its checkpoints equal those without offload byte for byte and resume resharded to 1 rank either
way (written with offload, read without, and the reverse) bit for bit; memory.json
equals plan.json (on a CPU run nothing leaves a device); with NVMe parameter offload it is refused
before training, naming the fix."""
import json
import os
import unittest

from common import ROOT, TrainsTheBase, main_args, read_bytes, run, step_losses, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--log_interval=100", "--resume=false"]
# Small chunks so the tiny model's shard takes many: the chunking and the threads' pieces all run.
OFFLOAD = ["--zero_optimization.offload_optimizer.device=cpu", "--zero_optimization.sub_group_size=20000"]


class HostOptimizerOffload(TrainsTheBase, unittest.TestCase):
    BASE = BASE
    STEPS = 2

    def test_bit_identical_to_no_offload_and_checkpoints_too(self):
        # Every pair of (ranks, stage), (stage, precision) and (ranks, precision) once: 6 runs, not 12.
        cases = [(1, 1, False), (2, 1, True), (2, 2, False), (1, 2, True), (2, 3, True), (1, 3, False)]
        for nproc, stage, bf16 in cases:
            with self.subTest(nproc=nproc, stage=stage, bf16=bf16):
                flags = [f"--zero_optimization.stage={stage}", f"--bf16.enabled={'true' if bf16 else 'false'}"]
                plain, off = tmpdir("ho_plain"), tmpdir("ho_off")
                self.assertNotIn("optimizer step on the host", self.train(plain, *flags, nproc=nproc))
                out = self.train(off, *flags, *OFFLOAD, nproc=nproc)
                self.assertIn("optimizer step on the host (offload_optimizer cpu): ", out)
                self.assertEqual(len(step_losses(off)), 2)
                self.assertEqual(step_losses(plain), step_losses(off))
                self.assertEqual(read_bytes(os.path.join(plain, "model.safetensors")),
                                 read_bytes(os.path.join(off, "model.safetensors")))
                with open(os.path.join(off, "memory.json")) as f:
                    mem = json.load(f)
                with open(os.path.join(off, "plan.json")) as f:
                    plan = json.load(f)["stages"][0]
                for key in ("compute_params", "gradients", "master_params", "optimizer_states", "total_model_states"):
                    self.assertEqual(mem[key], plan[key], key)
                # The final checkpoint (masters and moments) byte for byte, every rank's shard.
                step = os.path.join("checkpoints", "step-000002")
                for rank in range(nproc):
                    shard = os.path.join(step, f"rank-{rank:05d}.safetensors")
                    self.assertEqual(read_bytes(os.path.join(plain, shard)), read_bytes(os.path.join(off, shard)))
                if nproc == 2 and stage == 3:
                    # Resharded to 1 rank and resumed, loaded into the host optimizer from the checkpoint
                    # written without it, and without it from the one written with it: the same steps.
                    for d, extra in ((plain, OFFLOAD), (off, [])):
                        code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100",
                                                 "--nproc", "1", f"--out_dir={d}", *flags, "--resume=true",
                                                 "--steps=4", *extra])
                        self.assertEqual(code, 0, out + err)
                        self.assertIn("resumed from", out + err)
                    self.assertEqual(len(step_losses(off)), 4)
                    self.assertEqual(step_losses(plain), step_losses(off))

    def test_with_nvme_parameter_offload_is_refused_naming_the_fix(self):
        d = tmpdir("ho_refused")
        code, out, err, _ = run(BASE + ["--nproc", "1", "--steps=1", f"--out_dir={d}", "--zero_optimization.stage=3",
                                        *OFFLOAD, "--zero_optimization.offload_param.device=nvme",
                                        f"--zero_optimization.offload_param.nvme_path={d}"])
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("offload_optimizer.device \"cpu\" with offload_param.device \"nvme\" is not built", err)
        self.assertIn("set offload_optimizer.device to \"none\" or \"nvme\"", err)
        self.assertNotIn("step 1/", out)


if __name__ == "__main__":
    unittest.main(argv=main_args())
