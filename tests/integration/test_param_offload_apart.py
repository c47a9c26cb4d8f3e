"""Parameter offload as a GPU run does it (zero_optimization.offload_param.device "cpu" or "nvme" at ZeRO
stage 3 with the shards apart from the device; src/parallel/zero/zero_engine.h offload_param_apart,
shard_uploads.h), run here on the CPU with plain copies through the test-only environment variable
SHARDLM_TEST_OFFLOAD_APART=1 (train/config_options.h): every sharded unit's compute shard is a host
tensor apart from the "device" gather buffers, copied into its slot (nvme: read from its file into a
bounce buffer first) inside the prefetch window and all-gathered in place; the step updates the host
shards from device masters (no optimizer offload: DeepSpeed's layout, fp32 compute too) or through the host
optimizer (offload_optimizer cpu: an fp32 host shard is its master, one buffer; under 16-bit compute the cast
lands in the host shard itself). Against the same
run without offload, the reference: losses, grad norms, model.safetensors and both ranks' checkpoint
shards bit for bit on 2 ranks in fp32 and bf16, cpu and nvme each with and without the host optimizer, and
with NVMe optimizer states (ZeRO-Infinity as a GPU runs it: the masters paged through the host are cast straight
into the host shards, with no staging buffer: host memory holds only the shards and the gradient copies);
the 2-rank checkpoint resumes resharded to 1 rank with the same losses as the reference resumed alike;
memory.json equals plan.json key by key with the shards on the `host` line (nvme: on `offloaded`) and
none left in compute_params. (Breaking it fails it: an upload skipped for the last unit changes the
losses of every case.)"""
import json
import os
import unittest

from common import ROOT, main_args, read_bytes, run, step_losses, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
BASE = ["train", "--config", TINY, "--data.val=", "--log_interval=100", "--resume=false",
        "--zero_optimization.stage=3", "--zero_optimization.stage3_param_persistence_threshold=0",
        "--zero_optimization.stage3_prefetch_bucket_size=200000", "--checkpoint_interval=2"]
APART = {"SHARDLM_TEST_OFFLOAD_APART": "1"}
PRECISION = {"fp32": "--bf16.enabled=false", "bf16": "--bf16.enabled=true"}
OPTIMIZER_CPU = ["--zero_optimization.offload_optimizer.device=cpu", "--zero_optimization.sub_group_size=20000"]


def optimizer_off(device, path):
    if device is None:
        return []
    if device == "cpu":
        return OPTIMIZER_CPU
    return ["--zero_optimization.offload_optimizer.device=nvme", f"--zero_optimization.offload_optimizer.nvme_path={path}",
            "--zero_optimization.sub_group_size=20000"]
MEMORY_KEYS = ("compute_params", "gradients", "master_params", "optimizer_states", "host", "offloaded",
               "total_model_states")


def params_off(device, path):
    if device == "cpu":
        return ["--zero_optimization.offload_param.device=cpu"]
    return ["--zero_optimization.offload_param.device=nvme", f"--zero_optimization.offload_param.nvme_path={path}",
            "--zero_optimization.offload_param.max_in_cpu=0", "--zero_optimization.offload_param.buffer_count=2"]


def memory(d, name="memory.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


class ParamOffloadApart(unittest.TestCase):
    def train(self, d, *flags, nproc=2, steps=2, env=None, resume=False):
        code, out, err, _ = run(BASE + ["--nproc", str(nproc), f"--steps={steps}", f"--out_dir={d}", *flags] +
                                (["--resume=true"] if resume else []), extra_env=env)
        self.assertEqual(code, 0, out + err)
        return out + err

    def assert_same_run(self, ref, d):
        self.assertEqual(len(step_losses(d)), 2)
        self.assertEqual(step_losses(ref), step_losses(d))
        self.assertEqual(read_bytes(os.path.join(ref, "model.safetensors")),
                         read_bytes(os.path.join(d, "model.safetensors")))
        for rank in range(2):
            shard = os.path.join("checkpoints", "step-000002", f"rank-{rank:05d}.safetensors")
            self.assertEqual(read_bytes(os.path.join(ref, shard)), read_bytes(os.path.join(d, shard)), shard)

    def test_bit_identical_to_no_offload_checkpoints_resume_and_memory_as_planned(self):
        nvme = tmpdir("pa_nvme")
        ref = {p: tmpdir("pa_ref") for p in PRECISION}
        for p, d in ref.items():
            self.train(d, PRECISION[p])
        # (parameters, precision, optimizer offload): each device and precision, without optimizer offload, with
        # the host optimizer, and with NVMe states (ZeRO-Infinity: the paged masters cast into the host shards).
        cases = [("cpu", "fp32", None), ("cpu", "bf16", "cpu"), ("nvme", "bf16", None), ("nvme", "fp32", None),
                 ("cpu", "fp32", "cpu"), ("nvme", "bf16", "cpu"), ("nvme", "bf16", "nvme"), ("cpu", "fp32", "nvme")]
        first = None
        for device, precision, optimizer in cases:
            with self.subTest(device=device, precision=precision, optimizer=optimizer):
                d = tmpdir("pa_off")
                out = self.train(d, PRECISION[precision], *params_off(device, nvme), *optimizer_off(optimizer, nvme),
                                 env=APART)
                self.assertIn("parameter shards in host memory apart from the device", out)
                self.assertEqual("(files through host bounce buffers)" in out, device == "nvme")
                self.assert_same_run(ref[precision], d)
                mem, plan, before = memory(d), memory(d, "plan.json")["stages"][0], memory(ref[precision])
                for key in MEMORY_KEYS:
                    self.assertEqual(mem[key], plan[key], key)
                # Every unit is sharded (threshold 0): no compute parameter stays on the device; the shards'
                # bytes are host memory, or on disk with nvme (max_in_cpu 0).
                self.assertEqual(mem["compute_params"], 0)
                # fp32: the shard was the master (apart, a master of its own).
                masters = before["master_params"] or before["compute_params"]
                states = masters + before["optimizer_states"] if optimizer == "nvme" else 0
                self.assertEqual(mem["offloaded"], (before["compute_params"] if device == "nvme" else 0) + states)
                if optimizer == "nvme":
                    # Host memory holds the gradient copies and the shards themselves, and no staging buffer:
                    # the paged masters are cast straight into the host shards.
                    self.assertEqual(mem["host"], before["gradients"] + (before["compute_params"] if device == "cpu" else 0))
                    self.assertEqual(mem["master_params"] + mem["optimizer_states"], 0)
                if optimizer == "cpu":
                    # The host optimizer's masters, moments and gradient copies, each once: an fp32 host shard IS
                    # its master; under bf16 compute (fp32 masters) the host shard is the cast's staging buffer.
                    staged = before["compute_params"] if device == "cpu" and before["master_params"] else 0
                    self.assertEqual(mem["host"], masters + before["optimizer_states"] + before["gradients"] + staged)
                if not optimizer:
                    self.assertEqual(mem["host"], 0 if device == "nvme" else before["compute_params"])
                    # fp32: the shard was the master; its master now stays on the device.
                    self.assertEqual(mem["master_params"], before["master_params"] or before["compute_params"])
                first = first or d
        self.assertEqual(os.listdir(nvme), [], "the parameter files outlive the run")
        # Resharded 2 -> 1 and resumed with the apart layout: the reference resumed alike, loss for loss.
        self.train(ref["fp32"], PRECISION["fp32"], nproc=1, steps=4, resume=True)
        out = self.train(first, PRECISION["fp32"], *params_off("cpu", nvme), nproc=1, steps=4, env=APART,
                         resume=True)
        self.assertIn("resumed from", out)
        self.assertEqual(len(step_losses(first)), 4)
        self.assertEqual(step_losses(ref["fp32"]), step_losses(first))


if __name__ == "__main__":
    unittest.main(argv=main_args())
