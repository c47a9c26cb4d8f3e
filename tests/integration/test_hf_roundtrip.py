"""Models saved by the pinned transformers go through shardlm and back: `shardlm export` of a
transformers directory writes a config.json and weights that transformers loads as the same model
(its own class, the same logits bit for bit), for every family option; `shardlm train --init`
trains one and writes a directory transformers loads; a bad config.json is refused before
anything is written.

    /opt/shardlm/venv/bin/python tests/integration/test_hf_roundtrip.py build/shardlm
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args, read_metrics, run, tmpdir  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

BASE = dict(vocab_size=4096, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
CASES = {
    "llama_llama3_bias_head_dim": (transformers.LlamaConfig, dict(
        attention_bias=True, mlp_bias=True, head_dim=32, eos_token_id=[1, 2],
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama_yarn": (transformers.LlamaConfig, dict(
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 16.0, "truncate": False})),
    "llama_longrope": (transformers.LlamaConfig, dict(
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
                         "short_factor": [1.0 + i / 10 for i in range(8)],
                         "long_factor": [1.0 + i for i in range(8)]})),
    "llama_dynamic": (transformers.LlamaConfig, dict(
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    "mistral_window": (transformers.MistralConfig, dict(sliding_window=5)),
    "qwen2_windows_tied": (transformers.Qwen2Config, dict(
        use_sliding_window=True, sliding_window=6, max_window_layers=1, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def make_model(name, out, **save):
    config_class, extra = CASES[name]
    config = config_class(**dict(BASE, **extra))
    torch.manual_seed(sum(map(ord, name)))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)  # transformers initialises biases to zero
    model.save_pretrained(out, **save)
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits


def load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")


IDS = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(3))


class ExportRoundTrip(unittest.TestCase):
    def test_every_family_option_exports_to_the_same_model(self):
        for name in CASES:
            with self.subTest(case=name):
                src, out = tmpdir("hf_src"), os.path.join(tmpdir("hf_out"), "exported")
                original = make_model(name, src)
                code, _, err, _ = run(["export", "--run", src, "--out", out])
                self.assertEqual(code, 0, err)
                back = load(out)
                self.assertEqual(type(back).__name__, type(original).__name__)
                self.assertTrue(torch.equal(logits_of(back, IDS), logits_of(original, IDS)), name)
                with open(os.path.join(out, "config.json")) as f:
                    written = json.load(f)
                self.assertEqual(written["architectures"], [type(original).__name__])


    def test_a_sharded_checkpoint_is_read_through_its_index(self):
        # How the Hub holds every model over a few GB: model-0000k-of-0000n.safetensors + the index.
        src, out = tmpdir("hf_sharded"), os.path.join(tmpdir("hf_sharded_out"), "exported")
        original = make_model("llama_llama3_bias_head_dim", src, max_shard_size="200KB")
        shards = [f for f in os.listdir(src) if f.startswith("model-") and f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        self.assertTrue(os.path.exists(os.path.join(src, "model.safetensors.index.json")))
        code, _, err, _ = run(["export", "--run", src, "--out", out])
        self.assertEqual(code, 0, err)
        self.assertTrue(torch.equal(logits_of(load(out), IDS), logits_of(original, IDS)))
        os.remove(os.path.join(src, sorted(shards)[-1]))  # a shard the index lists is missing: named
        code, _, err, _ = run(["export", "--run", src, "--out", out + "2"])
        self.assertNotEqual(code, 0)
        self.assertIn(sorted(shards)[-1], err)


class TrainFromTransformers(unittest.TestCase):
    def test_train_init_writes_a_directory_transformers_loads(self):
        src, out = tmpdir("hf_init"), tmpdir("hf_run")
        make_model("qwen2_windows_tied", src)
        code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--model.preset=tiny",
                               "--steps=2", "--data.val=", f"--out_dir={out}", "--data.seq_len=16",
                               "--train_micro_batch_size_per_gpu=2", "--resume=false"])
        self.assertEqual(code, 0, err)
        self.assertEqual(len(read_metrics(out)), 2)
        trained = load(out)
        self.assertEqual(type(trained).__name__, "Qwen2ForCausalLM")
        self.assertEqual(trained.config.layer_types, ["full_attention", "sliding_attention"])
        self.assertTrue(torch.isfinite(logits_of(trained, IDS)).all())

    def test_step_one_loss_is_transformers_loss_on_the_first_batch(self):
        # The trainer's first logged loss is the loss before any update, over the first global batch:
        # rank 0, micro-step 0 reads the B*T+1 tokens from position 0 (docs/data.md, Data order).
        import struct
        B, T = 2, 16
        for name in CASES:
            with self.subTest(case=name):
                src, out = tmpdir("hf_step1"), tmpdir("hf_step1_run")
                model = make_model(name, src)
                code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--steps=1",
                                       "--data.val=", f"--out_dir={out}", f"--data.seq_len={T}",
                                       f"--train_micro_batch_size_per_gpu={B}", "--gradient_accumulation_steps=1",
                                       "--attn_implementation=eager", "--resume=false"])
                self.assertEqual(code, 0, err)
                with open(os.path.join(ROOT, "data", "brown", "train.bin"), "rb") as f:
                    f.seek(256 * 4)
                    tokens = torch.tensor(struct.unpack(f"<{B * T + 1}H", f.read(2 * (B * T + 1))))
                ids = torch.stack([tokens[b * T:(b + 1) * T] for b in range(B)])
                targets = torch.stack([tokens[b * T + 1:(b + 1) * T + 1] for b in range(B)])
                with torch.no_grad():
                    want = torch.nn.functional.cross_entropy(model(ids).logits.float().reshape(-1, 4096),
                                                             targets.reshape(-1)).item()
                got = read_metrics(out)[0]["loss"]
                self.assertLess(abs(got - want) / want, 1e-5, f"{name}: shardlm {got} vs transformers {want}")
                print(f"  {name:28s} step-1 loss shardlm {got:.7f}, transformers {want:.7f}")

    def test_a_bad_config_is_refused_before_anything_is_written(self):
        src, out = tmpdir("hf_bad"), tmpdir("hf_bad_run")
        make_model("mistral_window", src)
        path = os.path.join(src, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["rope_parameters"] = {"rope_type": "su", "rope_theta": 10000.0}
        with open(path, "w") as f:
            json.dump(cfg, f)
        code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--steps=1",
                               "--data.val=", f"--out_dir={out}", "--data.seq_len=16", "--resume=false"])
        self.assertNotEqual(code, 0)
        self.assertIn('"su"', err)
        self.assertEqual(os.listdir(out), [])


if __name__ == "__main__":
    unittest.main(argv=main_args(), verbosity=2)
