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


def reference_val_loss(params, cfg, N, B, T, batches):
    """The trainer's final val_loss recomputed by tests/reference/hf_llama.py: every rank r of N
    evaluates micro-steps m = 0..batches-1, global sample k = m*N + r, at window start (k mod S)*B*T with
    S = (len-1) // (B*T) windows (README: Data order)."""
    tokens = read_llmc(os.path.join(ROOT, "data", "brown", "val.bin"))
    S = (len(tokens) - 1) // (B * T)
    losses = []
    with torch.no_grad():
        for r in range(N):
            for m in range(batches):
                start = ((m * N + r) % S) * B * T
                window = tokens[start : start + B * T + 1]
                x, y = window[:-1].view(B, T), window[1:].view(B, T)
                losses.append(hf_llama.loss_fn(hf_llama.forward(params, cfg, x), y).item())
    return sum(losses) / len(losses)


PHASES = ("time_data_s", "time_forward_s", "time_backward_s", "time_grad_sync_s", "time_optimizer_s")


def check_phases(test, rows):
    """Every layout times the same phases of every step (the one schedule-driven step path), each a
    positive share of the step."""
    for r in rows:
        for key in PHASES:
            test.assertIn(key, r, f"step {r['step']}")
            test.assertTrue(0 < r[key] < r["step_time_s"], f"{key} of step {r['step']}: {r[key]}")


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
        # An evaluation is timed apart, after the step: tokens/s is the step's own.
        self.assertEqual([r["step"] for r in m if "eval_time_s" in r], [5, 10, 15, 20])
        for r in m:
            self.assertEqual(r["tokens_per_s"], 4 * 32 * 2 / r["step_time_s"])
            if "eval_time_s" in r:
                self.assertGreater(r["eval_time_s"], 0)
        check_phases(self, m)
        first, last = sum(r["loss"] for r in m[:3]) / 3, sum(r["loss"] for r in m[-3:]) / 3
        self.assertLess(last, first - 0.5, "the model did not learn")

    def test_exported_model_reproduces_val_loss_in_reference_implementation(self):
        hf_dir = os.path.join(self.out, "hf")
        code, out, err, _ = run(["export", "--run", self.out, "--out", hf_dir])
        self.assertEqual(code, 0, out + err)
        cfg, params, cfg_json = load_hf_dir(hf_dir)
        self.assertEqual(cfg_json["architectures"], ["LlamaForCausalLM"])
        self.assertIn("lm_head.weight", params)
        reference = reference_val_loss(params, cfg, N=2, B=4, T=32, batches=2)
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

    def test_export_never_overwrites_its_source_or_an_earlier_export(self):
        before = read_bytes(os.path.join(self.out, "model.safetensors"))
        code, out, err, _ = run(["export", "--run", self.out, "--out", self.out, "--dtype", "bf16"])
        self.assertNotEqual(code, 0)
        self.assertIn("is the run directory itself", err)
        self.assertEqual(read_bytes(os.path.join(self.out, "model.safetensors")), before)  # nothing written
        hf_dir = os.path.join(self.out, "hf_twice")
        code, out, err, _ = run(["export", "--run", self.out, "--out", hf_dir])
        self.assertEqual(code, 0, out + err)
        first = read_bytes(os.path.join(hf_dir, "model.safetensors"))
        code, out, err, _ = run(["export", "--run", self.out, "--out", hf_dir, "--dtype", "bf16"])
        self.assertNotEqual(code, 0)
        self.assertIn("already holds config.json, model.safetensors", err)
        self.assertEqual(read_bytes(os.path.join(hf_dir, "model.safetensors")), first)

    def test_generate_samples_text(self):
        code, out, err, _ = run(["generate", "--model", self.out, "--tokenizer",
                                 os.path.join(ROOT, "data", "brown", "tokenizer.model"), "--prompt", "The jury",
                                 "--max-new-tokens", "12", "--seed", "3"])
        self.assertEqual(code, 0, out + err)
        self.assertTrue(out.startswith("The jury"), out)
        self.assertGreater(len(out.strip()), len("The jury") + 5, out)


class TensorParallelTrainAndExport(unittest.TestCase):
    """tp=2 with sequence parallelism on 2 ranks (dp=1): the saved model is the shards gathered into
    HF tensors, and HF's math on it reproduces the trainer's vocab-parallel validation loss."""

    def test_tp2_run_exports_whole_hf_tensors(self):
        out_dir = tmpdir("e2e_tp")
        code, out, err, secs = run(["train", "--config", TINY, "--nproc", "2", "--steps=10", f"--out_dir={out_dir}",
                                    "--parallelism.tensor_parallel=2", "--parallelism.sequence_parallel=true"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("(dp=1 tp=2 pp=1)", out)
        self.assertIn("tp=2 (sequence parallel) x", out)
        m = read_metrics(out_dir)
        self.assertLess(m[-1]["loss"], m[0]["loss"] - 0.5, "the model did not learn")
        self.assertGreater(m[-1]["comm_tp_reduce_scatter_bytes"], 0)
        memory = json.loads(read_bytes(os.path.join(out_dir, "memory.json")))
        self.assertLess(memory["parameters_held"], memory["parameters"])
        cfg, params, _ = load_hf_dir(out_dir)
        self.assertEqual(tuple(params["model.embed_tokens.weight"].shape), (cfg.vocab_size, cfg.hidden_size))
        self.assertEqual(tuple(params["model.layers.0.mlp.down_proj.weight"].shape),
                         (cfg.hidden_size, cfg.intermediate_size))
        reference = reference_val_loss(params, cfg, N=1, B=4, T=32, batches=2)
        trained = m[-1]["val_loss"]
        print(f"tp=2 run ({secs:.1f}s) final val_loss: shardlm {trained:.7f}, reference {reference:.7f}")
        self.assertAlmostEqual(trained, reference, delta=1e-5 * reference)

    def test_bf16_zero2_with_tp_learns(self):
        out_dir = tmpdir("e2e_tp_bf16")
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", "--steps=10", f"--out_dir={out_dir}",
                                 "--parallelism.tensor_parallel=2", "--bf16.enabled=true",
                                 "--zero_optimization.stage=2", "--activation_checkpointing.mode=full"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("tp=2 x ZeRO stage 2, bf16", out)
        m = read_metrics(out_dir)
        self.assertLess(m[-1]["loss"], m[0]["loss"] - 0.5, "the model did not learn")

    def test_a_split_the_job_cannot_make_is_refused_with_the_arithmetic(self):
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", "--steps=1",
                                 f"--out_dir={tmpdir('e2e_tp_bad')}", "--parallelism.tensor_parallel=4"])
        self.assertNotEqual(code, 0)
        self.assertIn("2 rank(s), which tensor_parallel x pipeline_parallel = 4 x 1 = 4 does not divide", out + err)
        self.assertNotIn("internal error", out + err)
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", "--steps=1",
                                 f"--out_dir={tmpdir('e2e_tp_bad3')}", "--parallelism.tensor_parallel=3"])
        self.assertNotEqual(code, 0)
        self.assertIn("does not divide the attention heads (num_attention_heads) (4 / 3 = 1.33333)", out + err)


class PipelineTrainAndExport(unittest.TestCase):
    """pp=2 (1F1B, 4 micro-batches) on 2 ranks: each stage holds its layers, the saved model is whole,
    and HF's math on it reproduces the validation loss the last stage computed."""

    def test_pp2_run_exports_whole_hf_tensors(self):
        out_dir = tmpdir("e2e_pp")
        code, out, err, secs = run(["train", "--config", TINY, "--nproc", "2", "--steps=10", f"--out_dir={out_dir}",
                                    "--parallelism.pipeline_parallel=2", "--gradient_accumulation_steps=4",
                                    "--train_micro_batch_size_per_gpu=1"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("(dp=1 tp=1 pp=2)", out)
        self.assertIn("bubble (p-1)/(m+p-1) = 20%", out)
        m = read_metrics(out_dir)
        self.assertLess(m[-1]["loss"], m[0]["loss"] - 0.5, "the model did not learn")
        self.assertGreater(m[-1]["comm_pp_send_bytes"], 0)
        check_phases(self, m)
        memory = json.loads(read_bytes(os.path.join(out_dir, "memory.json")))
        self.assertLess(memory["parameters_held"], memory["parameters"])
        cfg, params, _ = load_hf_dir(out_dir)
        self.assertEqual(len(params), 2 + 9 * cfg.num_hidden_layers + (0 if cfg.tie_word_embeddings else 1))
        reference = reference_val_loss(params, cfg, N=1, B=1, T=32, batches=2)
        trained = m[-1]["val_loss"]
        print(f"pp=2 run ({secs:.1f}s) final val_loss: shardlm {trained:.7f}, reference {reference:.7f}")
        self.assertAlmostEqual(trained, reference, delta=1e-5 * reference)

    def test_fewer_micro_batches_than_stages_warns_with_the_bubble(self):
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", "--steps=1",
                                 f"--out_dir={tmpdir('e2e_pp_m1')}", "--parallelism.pipeline_parallel=2"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("bubble (p-1)/(m+p-1) = 50% — fewer micro-batches than stages", out)


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
