"""ZeRO-Offload's optimizer half (zero_optimization.offload_optimizer.device "cpu";
src/parallel/zero/host_optimizer.h): at ZeRO stages 1-3 the step runs through the host optimizer, the
shard cut into sub_group_size chunks and each chunk's pieces stepped by CPU threads. Two layouts, each
against the same run without offload as the reference:
- a CPU run's: the engine's own AdamW, its masters and gradient views used in place;
- a GPU run's, run here with plain copies through the test-only environment variable
  SHARDLM_TEST_OFFLOAD_APART=1 (train/config_options.h): masters and moments only in host buffers
  (fp32 too), gradients copied down after the device's norm and clipping, parameters cast and copied
  up, the full-model gather and the 8-bit blocks' absmax all-reduce through the device.
Losses, grad norms, final weights and every rank's final checkpoint shard bit for bit, each layout at
stages 1-3 on 1 and 2 ranks in fp32 and bf16; the GPU layout also in fp16 with loss scaling at stage 1
(per-unit unscale multipliers) and with 8-bit moments whose blocks the 2 ranks' shards cut (the absmax
all-reduce). A 2-rank ZeRO-3 run resumes resharded to 1 rank bit for bit: written with offload and read
without, the reverse, and the GPU layout's read by the GPU layout. memory.json equals plan.json, with
the GPU layout's masters, moments and staging on the `host` line and none of them in the device
categories. (With NVMe parameter offload in place: tests/integration/test_param_offload.py.) (Breaking a
copy fails it: skipping the last chunk's gradient copy fails every GPU-layout case, skipping the
absmax copy back from the device the 8-bit one.)
The GPU layout of offload_optimizer "nvme" (ZeRO-Infinity's: masters and moments in the files, each
chunk's gradients copied down and parameters up through host staging buffers, the same ChunkTransfers)
is proven the same way: stages 1-3, fp32 and bf16, 8-bit moments whose blocks the 2 ranks cut, 1 and 2
ranks, resumed resharded 2 -> 1 rank; memory.json equals plan.json with only the staging on `host`
and the masters and moments `offloaded`. Both GPU layouts also run with pipeline parallelism (2 stages)
and expert parallelism (a tiny Mixtral, ep 2: two engines, two sets of host buffers and files), bit for
bit as without offload, rank 0's memory.json equal to its pipeline stage's plan."""
import json
import os
import unittest

from common import ROOT, TrainsTheBase, main_args, read_bytes, run, step_losses, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--log_interval=100", "--resume=false"]
# Small chunks so the tiny model's shard takes many: the chunking and the threads' pieces all run.
OFFLOAD = ["--zero_optimization.offload_optimizer.device=cpu", "--zero_optimization.sub_group_size=20000"]


# The GPU layout on a CPU run (test only; train/config_options.h host_optimizer_apart).
APART = {"SHARDLM_TEST_OFFLOAD_APART": "1"}
# offload_optimizer nvme (in the GPU layout: through the host's staging buffers), the same chunks.
NVME_DIR = tmpdir("ho_nvme")
NVME = ["--zero_optimization.offload_optimizer.device=nvme", f"--zero_optimization.offload_optimizer.nvme_path={NVME_DIR}",
        "--zero_optimization.sub_group_size=20000"]
MEMORY_KEYS = ("compute_params", "gradients", "master_params", "optimizer_states", "host", "offloaded",
               "total_model_states")
PRECISION = {"fp32": ["--bf16.enabled=false"], "bf16": ["--bf16.enabled=true"],
             "fp16": ["--fp16.enabled=true"], "8bit": ["--optimizer.state_precision=8bit",
                                                       "--optimizer.min_8bit_size=1024"]}


class HostOptimizerOffload(TrainsTheBase, unittest.TestCase):
    BASE = BASE
    STEPS = 2

    def train_env(self, d, *flags, nproc, env=None):
        code, out, err, _ = run(self.BASE + ["--nproc", str(nproc), f"--steps={self.STEPS}", f"--out_dir={d}", *flags],
                                extra_env=env)
        self.assertEqual(code, 0, out + err)
        return out + err

    def assert_same_run(self, plain, other, nproc):
        self.assertEqual(len(step_losses(other)), 2)
        self.assertEqual(step_losses(plain), step_losses(other))
        self.assertEqual(read_bytes(os.path.join(plain, "model.safetensors")),
                         read_bytes(os.path.join(other, "model.safetensors")))
        # The final checkpoint (masters and moments) byte for byte, every rank's shard.
        step = os.path.join("checkpoints", "step-000002")
        for rank in range(nproc):
            shard = os.path.join(step, f"rank-{rank:05d}.safetensors")
            self.assertEqual(read_bytes(os.path.join(plain, shard)), read_bytes(os.path.join(other, shard)))

    def assert_memory_as_planned(self, d, apart):
        with open(os.path.join(d, "memory.json")) as f:
            mem = json.load(f)
        with open(os.path.join(d, "plan.json")) as f:
            plan = json.load(f)["stages"][0]
        for key in MEMORY_KEYS:
            self.assertEqual(mem[key], plan[key], key)
        if apart:  # nothing of the optimizer on the device; masters, moments and staging on the host
            self.assertEqual((mem["master_params"], mem["optimizer_states"]), (0, 0))
            self.assertGreater(mem["host"], 0)
        else:
            self.assertEqual(mem["host"], 0)

    def test_bit_identical_to_no_offload_and_checkpoints_too(self):
        # Each layout at stages 1-3, on 1 and 2 ranks, fp32 and bf16; the GPU layout also with fp16 and
        # 8-bit moments (fp32 compute) whose blocks the 2 ranks' shards cut; the resharded case with both.
        # NVMe states in the GPU layout at each stage, fp32, 8-bit and bf16, resharded too.
        cases = [(1, 1, "fp32", "in place"), (2, 1, "fp16", "apart"), (2, 2, "8bit", "apart"),
                 (1, 2, "bf16", "in place"), (2, 3, "bf16", "both"), (1, 3, "fp32", "apart")]
        nvme_cases = {(1, 1), (2, 2), (2, 3)}
        for nproc, stage, precision, layouts in cases:
            in_place, apart_too = layouts != "apart", layouts != "in place"
            with self.subTest(nproc=nproc, stage=stage, precision=precision):
                flags = [f"--zero_optimization.stage={stage}", *PRECISION[precision]]
                plain, off, apart = tmpdir("ho_plain"), tmpdir("ho_off"), tmpdir("ho_apart")
                on_disk = tmpdir("ho_nvme_run")
                self.assertNotIn("optimizer step on the host", self.train(plain, *flags, nproc=nproc))
                if in_place:
                    out = self.train(off, *flags, *OFFLOAD, nproc=nproc)
                    self.assertIn("optimizer step on the host (offload_optimizer cpu): masters and moments in host "
                                  "memory, used in place", out)
                    self.assert_same_run(plain, off, nproc)
                    self.assert_memory_as_planned(off, apart=False)
                if apart_too:
                    out = self.train_env(apart, *flags, *OFFLOAD, nproc=nproc, env=APART)
                    self.assertIn("optimizer step on the host (offload_optimizer cpu): masters and moments in host "
                                  "buffers apart from the device's", out)
                    self.assert_same_run(plain, apart, nproc)
                    self.assert_memory_as_planned(apart, apart=True)
                if (nproc, stage) in nvme_cases:
                    out = self.train_env(on_disk, *flags, *NVME, nproc=nproc, env=APART)
                    self.assertIn(f"on NVMe at {NVME_DIR} (", out)
                    self.assertIn("(fp32 masters + moments)", out)  # fp32 too: the host master is not the shard
                    self.assertIn("per chunk, gradients copied down and parameters up through host buffers apart", out)
                    self.assert_same_run(plain, on_disk, nproc)
                    self.assert_memory_as_planned(on_disk, apart=True)
                    with open(os.path.join(plain, "memory.json")) as f:
                        before = json.load(f)
                    with open(os.path.join(on_disk, "memory.json")) as f:
                        after = json.load(f)
                    # On disk: every master (fp32 too) and moment; on the host only the gradient and cast
                    # staging (the engine checks its buffers against that formula).
                    self.assertGreaterEqual(after["offloaded"], before["master_params"] + before["optimizer_states"])
                if layouts == "both":
                    # Resharded to 1 rank and resumed, loaded into the host optimizer from the checkpoint
                    # written without it, without it from the one written with it, and into the GPU
                    # layout from the GPU layout's (host and NVMe): the same steps.
                    resumed = ((plain, OFFLOAD, None), (off, [], None), (apart, OFFLOAD, APART), (on_disk, NVME, APART))
                    for d, extra, env in resumed:
                        code, out, err, _ = run(["train", "--config", TINY, "--data.val=", "--log_interval=100",
                                                 "--nproc", "1", f"--out_dir={d}", *flags, "--resume=true",
                                                 "--steps=4", *extra], extra_env=env)
                        self.assertEqual(code, 0, out + err)
                        self.assertIn("resumed from", out + err)
                    for d in (off, apart, on_disk):
                        self.assertEqual(len(step_losses(d)), 4)
                        self.assertEqual(step_losses(plain), step_losses(d))
        self.assertEqual(os.listdir(NVME_DIR), [], "the state files outlive the run")

    def test_pipeline_and_expert_parallelism_in_the_gpu_layout_are_bit_identical(self):
        # Pipeline stages with host states, the experts' two engines with NVMe (two sets of files).
        layouts = {
            ("pp", "cpu"): ["--parallelism.pipeline_parallel=2", "--gradient_accumulation_steps=2",
                            "--zero_optimization.stage=1", "--bf16.enabled=true"],
            ("ep", "nvme"): ["--model.model_type=mixtral", "--model.num_local_experts=4", "--model.num_experts_per_tok=2",
                             "--model.intermediate_size=64", "--parallelism.expert_parallel=2",
                             "--zero_optimization.stage=2", "--bf16.enabled=false"]}
        for (layout, device), flags in layouts.items():
            plain = tmpdir("ho_ppep_plain")
            self.train(plain, *flags, nproc=2)
            extra = OFFLOAD if device == "cpu" else NVME
            with self.subTest(layout=layout, device=device):
                d = tmpdir("ho_ppep")
                self.train_env(d, *flags, *extra, nproc=2, env=APART)
                self.assert_same_run(plain, d, 2)
                with open(os.path.join(d, "memory.json")) as f:
                    mem = json.load(f)
                with open(os.path.join(d, "plan.json")) as f:
                    plan = json.load(f)
                planned = plan["pipeline_stages"][0]["memory"][0] if layout == "pp" else plan["stages"][0]
                for key in MEMORY_KEYS:
                    self.assertEqual(mem[key], planned[key], key)
                self.assertEqual((mem["master_params"], mem["optimizer_states"]), (0, 0))
                self.assertGreater(mem["host"], 0)
                self.assertEqual(mem["offloaded"] > 0, device == "nvme")
        self.assertEqual(os.listdir(NVME_DIR), [], "the state files outlive the run")


if __name__ == "__main__":
    unittest.main(argv=main_args())
