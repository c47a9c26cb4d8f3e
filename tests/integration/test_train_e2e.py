"""End to end through the command line: train with 2 ranks, export a Hugging Face directory, check
that an independent HF-math implementation (tests/reference/hf_llama.py on the pinned torch) loading
the exported files reproduces the trainer's final validation loss over the documented data order,
and sample text with `generate`."""
import inspect
import json
import math
import os
import struct
import unittest

import torch

from common import ROOT, main_args, read_bytes, read_metrics, run, tmpdir
import hf_llama
import safetensors_py

TINY = os.path.join(ROOT, "configs", "tiny.json")


def read_llmc(path):
    raw = read_bytes(path)
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert magic == 20240520 and version == 1
    return torch.tensor(struct.unpack(f"<{n}H", raw[1024 : 1024 + 2 * n]), dtype=torch.long)


def load_hf_dir(d):
    cfg_json = json.loads(read_bytes(os.path.join(d, "config.json")))
    accepted = inspect.signature(hf_llama.LlamaConfig.__init__).parameters
    cfg = hf_llama.LlamaConfig(**{k: v for k, v in cfg_json.items() if k in accepted})
    params, _ = safetensors_py.load_file(os.path.join(d, "model.safetensors"))
    return cfg, {k: v.float() for k, v in params.items()}, cfg_json


class TrainExportGenerate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = tmpdir("e2e")
        cls.steps = 20
        code, out, err, secs = run(["train", "--config", TINY, "--nproc", "2", f"--steps={cls.steps}",
                                    f"--out_dir={cls.out}", "--log_interval=5"])
        assert code == 0, out + err
        cls.stdout = out
        print(f"2-rank tiny run: {secs:.1f}s")

    def test_progress_lines_and_metrics(self):
        self.assertIn(f"step {self.steps}/{self.steps} | loss", self.stdout)
        self.assertIn("tok/s", self.stdout)
        self.assertIn("eta", self.stdout)
        m = read_metrics(self.out)
        self.assertEqual([r["step"] for r in m], list(range(1, self.steps + 1)))
        for r in m:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                self.assertIn(key, r)
                self.assertTrue(math.isfinite(r[key]))
        self.assertEqual([r["step"] for r in m if "val_loss" in r], [5, 10, 15, 20])  # eval_interval 5
        first, last = sum(r["loss"] for r in m[:3]) / 3, sum(r["loss"] for r in m[-3:]) / 3
        self.assertLess(last, first - 0.5, "the model did not learn")

    def test_exported_model_reproduces_val_loss_in_reference_implementation(self):
        hf_dir = os.path.join(self.out, "hf")
        code, out, err, _ = run(["export", "--run", self.out, "--out", hf_dir])
        self.assertEqual(code, 0, out + err)
        cfg, params, cfg_json = load_hf_dir(hf_dir)
        self.assertEqual(cfg_json["architectures"], ["LlamaForCausalLM"])
        self.assertIn("lm_head.weight", params)
        # The trainer's final val_loss: every rank r of N evaluates micro-steps m = 0..eval_batches-1
        # at window start ((m mod E)*N + r)*B*T with E = (len-1) // (N*B*T).
        tokens = read_llmc(os.path.join(ROOT, "data", "brown", "val.bin"))
        N, B, T, batches = 2, 4, 32, 2
        E = (len(tokens) - 1) // (N * B * T)
        losses = []
        with torch.no_grad():
            for r in range(N):
                for m in range(batches):
                    start = ((m % E) * N + r) * B * T
                    window = tokens[start : start + B * T + 1]
                    x, y = window[:-1].view(B, T), window[1:].view(B, T)
                    losses.append(hf_llama.loss_fn(hf_llama.forward(params, cfg, x), y).item())
        reference = sum(losses) / len(losses)
        trained = read_metrics(self.out)[-1]["val_loss"]
        print(f"final val_loss: shardlm {trained:.7f}, reference on exported weights {reference:.7f}")
        self.assertAlmostEqual(trained, reference, delta=1e-5 * reference)

    def test_bf16_export_rounds_the_same_weights(self):
        hf_dir = os.path.join(self.out, "hf_bf16")
        code, out, err, _ = run(["export", "--run", self.out, "--out", hf_dir, "--dtype", "bf16"])
        self.assertEqual(code, 0, out + err)
        raw, _ = safetensors_py.load_file(os.path.join(hf_dir, "model.safetensors"))
        full, _ = safetensors_py.load_file(os.path.join(self.out, "model.safetensors"))
        self.assertEqual(list(raw), list(full))
        for k in full:
            self.assertEqual(raw[k].dtype, torch.bfloat16)
            self.assertTrue(torch.equal(raw[k], full[k].to(torch.bfloat16)), k)
        self.assertEqual(json.loads(read_bytes(os.path.join(hf_dir, "config.json")))["torch_dtype"], "bfloat16")

    def test_generate_samples_text(self):
        code, out, err, _ = run(["generate", "--model", self.out, "--tokenizer",
                                 os.path.join(ROOT, "data", "brown", "tokenizer.model"), "--prompt", "The jury",
                                 "--max-new-tokens", "12", "--seed", "3"])
        self.assertEqual(code, 0, out + err)
        self.assertTrue(out.startswith("The jury"), out)
        self.assertGreater(len(out.strip()), len("The jury") + 5, out)


class Version(unittest.TestCase):
    def test_version_names_the_stack_with_cuda_and_nccl(self):
        code, out, err, _ = run(["--version"])
        self.assertEqual(code, 0, out + err)
        self.assertIn(f"libtorch {torch.__version__.split('+')[0]}", out)
        self.assertIn("CUDA: compiled into libtorch (runtime 13.0)", out)
        self.assertRegex(out, r"NCCL: compiled into libtorch \(2\.\d+\.\d+\); shardlm's NCCL backend "
                              r"\(comm.backend=nccl\) built")
        self.assertIn("MPI: Open MPI", out)


if __name__ == "__main__":
    unittest.main(argv=main_args())
