"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) saved by the pinned transformers go through shardlm and back (the MoE
part of issue 25; test_hf_roundtrip.py does the same for the dense families):

- `shardlm export` of a Mixtral / Qwen2-MoE directory (experts one tensor per expert, as
  save_pretrained writes them) writes the same tensor names and a directory transformers loads as
  the same model: its own class, the same logits bit for bit;
- `shardlm train --init` logs as its first loss what transformers computes on the first batch,
  with router_aux_loss_coef x the load-balancing loss added when output_router_logits is set
  (MixtralForCausalLM.forward), and without it otherwise, and metrics.jsonl's router_aux_loss is
  transformers' aux_loss; and it writes a directory whose experts
  are one tensor per expert under save_pretrained's names, which transformers loads;
- `export --source checkpoint` streams the fused experts of a sharded checkpoint out one tensor
  per expert, equal to the trained directory's, in one file or index shards;
- a config.json with top-k above the expert count is refused naming both keys.

    /opt/shardlm/venv/bin/python tests/integration/test_moe_roundtrip.py build/shardlm
"""
import json
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args, read_metrics, run, tmpdir  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import safetensors_py  # noqa: E402

BASE = dict(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, rms_norm_eps=1e-5)
CASES = {
    "mixtral_aux": (transformers.MixtralConfig, dict(
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.05)),
    "mixtral_window": (transformers.MixtralConfig, dict(
        intermediate_size=48, num_local_experts=3, num_experts_per_tok=2, sliding_window=5)),
    "qwen2_moe_shared": (transformers.Qwen2MoeConfig, dict(
        intermediate_size=80, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False, output_router_logits=True,
        router_aux_loss_coef=0.05)),
    "qwen3_moe_qk_norm": (transformers.Qwen3MoeConfig, dict(
        intermediate_size=80, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[0], attention_bias=True, output_router_logits=True, router_aux_loss_coef=0.05)),
}
IDS = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(3))


def make_model(name, out):
    config_class, extra = CASES[name]
    config = config_class(**dict(BASE, **extra))
    torch.manual_seed(sum(map(ord, name)))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)  # transformers initialises biases to zero
            if n.endswith("mlp.gate.weight"):
                p.normal_(0, 0.3)  # routing that differs per token
    model.save_pretrained(out)
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits


def load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")


def tensor_names(path):
    tensors, _ = safetensors_py.load_file(os.path.join(path, "model.safetensors"))
    return sorted(tensors)


class MoeRoundTrip(unittest.TestCase):
    def test_export_is_the_same_model_for_transformers(self):
        for name in CASES:
            with self.subTest(case=name):
                src, out = tmpdir("moe_src"), os.path.join(tmpdir("moe_out"), "exported")
                original = make_model(name, src)
                self.assertTrue(any(".experts.0." in n for n in tensor_names(src)))  # one tensor per expert
                code, _, err, _ = run(["export", "--run", src, "--out", out])
                self.assertEqual(code, 0, err)
                self.assertEqual(tensor_names(out), tensor_names(src))  # one tensor per expert again
                back = load(out)
                self.assertEqual(type(back).__name__, type(original).__name__)
                self.assertTrue(torch.equal(logits_of(back, IDS), logits_of(original, IDS)), name)
                with open(os.path.join(out, "config.json")) as f:
                    written = json.load(f)
                for key in ("num_experts_per_tok", "router_aux_loss_coef", "output_router_logits"):
                    self.assertEqual(written[key], getattr(original.config, key), key)

    def test_step_one_loss_adds_the_aux_loss_as_transformers_does(self):
        B, T = 2, 16
        with open(os.path.join(ROOT, "data", "brown", "train.bin"), "rb") as f:
            f.seek(256 * 4)
            tokens = torch.tensor(struct.unpack(f"<{B * T + 1}H", f.read(2 * (B * T + 1))))
        ids = torch.stack([tokens[b * T:(b + 1) * T] for b in range(B)])
        targets = torch.stack([tokens[b * T + 1:(b + 1) * T + 1] for b in range(B)])
        for name in CASES:
            with self.subTest(case=name):
                src, out = tmpdir("moe_step1"), tmpdir("moe_step1_run")
                model = make_model(name, src)
                code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--steps=1",
                                       "--data.val=", f"--out_dir={out}", f"--data.seq_len={T}",
                                       f"--train_micro_batch_size_per_gpu={B}", "--gradient_accumulation_steps=1",
                                       "--attn_implementation=eager", "--resume=false"])
                self.assertEqual(code, 0, err)
                with torch.no_grad():
                    result = model(ids)
                    ce = torch.nn.functional.cross_entropy(result.logits.float().reshape(-1, 4096),
                                                           targets.reshape(-1))
                    want = ce.item()
                    if model.config.output_router_logits:  # MixtralForCausalLM.forward: loss += coef * aux
                        want = (ce + model.config.router_aux_loss_coef * result.aux_loss).item()
                got = read_metrics(out)[0]["loss"]
                self.assertLess(abs(got - want) / want, 1e-5, f"{name}: shardlm {got} vs transformers {want}")
                metrics = read_metrics(out)[0]
                if model.config.output_router_logits:
                    self.assertGreater(abs(got - ce.item()) / want, 1e-4, "the aux loss must show in the loss")
                    # metrics.jsonl's router_aux_loss: the load-balancing loss itself, before its factor
                    aux = result.aux_loss.item()
                    self.assertLess(abs(metrics["router_aux_loss"] - aux) / aux, 1e-5, metrics)
                else:
                    self.assertNotIn("router_aux_loss", metrics)
                print(f"  {name:18s} step-1 loss shardlm {got:.7f}, transformers {want:.7f} (CE alone {ce.item():.7f})")
                # The trained directory: experts one tensor per expert under save_pretrained's names.
                self.assertEqual(tensor_names(out), tensor_names(src))
                self.assertTrue(torch.isfinite(logits_of(load(out), IDS)).all())

    def test_checkpoint_export_writes_one_tensor_per_expert(self):
        # `export --source checkpoint` streams the sharded checkpoint's fused experts as per-expert
        # slices; in fp32 they equal the trained directory's weights, also across index shards.
        src, run_dir = tmpdir("moe_ckpt_src"), tmpdir("moe_ckpt_run")
        make_model("qwen3_moe_qk_norm", src)
        code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--steps=2",
                               "--data.val=", f"--out_dir={run_dir}", "--data.seq_len=16",
                               "--train_micro_batch_size_per_gpu=2", "--resume=false"])
        self.assertEqual(code, 0, err)
        trained, _ = safetensors_py.load_file(os.path.join(run_dir, "model.safetensors"))
        for shard in ("0", "200KB"):
            with self.subTest(max_shard_size=shard):
                out = os.path.join(tmpdir("moe_ckpt_out"), "exported")
                code, _, err, _ = run(["export", "--run", run_dir, "--out", out, "--source", "checkpoint",
                                       "--max-shard-size", shard])
                self.assertEqual(code, 0, err)
                exported = {}
                for f in os.listdir(out):
                    if f.endswith(".safetensors"):
                        exported.update(safetensors_py.load_file(os.path.join(out, f))[0])
                self.assertEqual(sorted(exported), sorted(trained))
                self.assertTrue(any(".experts.3." in n for n in exported))
                for name, t in trained.items():
                    self.assertTrue(torch.equal(exported[name], t), name)
                self.assertTrue(torch.equal(logits_of(load(out), IDS), logits_of(load(run_dir), IDS)))

    def test_moe_demo_config_trains_mixtral_at_the_dense_demos_active_size(self):
        # configs/moe_demo.json (bench/moe_demo.py's MoE side): 8 experts of width 512, top-2, beside
        # the dense demo's one MLP of width 1024. It trains on the bundled corpus (2 short steps here)
        # and writes a Mixtral that transformers loads with those experts.
        out = tmpdir("moe_demo")
        code, _, err, _ = run(["train", "--config", "configs/moe_demo.json", "--steps=2", "--data.seq_len=32",
                               "--train_micro_batch_size_per_gpu=2", "--eval_interval=0", f"--out_dir={out}",
                               "--checkpoint_interval=0"])
        self.assertEqual(code, 0, err)
        rows = read_metrics(out)
        self.assertEqual([r["step"] for r in rows], [1, 2])
        for r in rows:
            self.assertTrue(0 < r["loss"] < 20 and 0 < r["router_aux_loss"] < 20, r)
        model = load(out)
        self.assertEqual(type(model).__name__, "MixtralForCausalLM")
        c = model.config
        self.assertEqual((c.num_local_experts, c.num_experts_per_tok, c.intermediate_size), (8, 2, 512))
        self.assertEqual(c.num_experts_per_tok * c.intermediate_size, 1024)  # the dense demo's MLP width

    def test_top_k_above_the_expert_count_is_refused(self):
        src, out = tmpdir("moe_bad"), tmpdir("moe_bad_run")
        make_model("mixtral_window", src)
        path = os.path.join(src, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["num_experts_per_tok"] = 4
        with open(path, "w") as f:
            json.dump(cfg, f)
        code, _, err, _ = run(["train", "--config", "configs/tiny.json", f"--init={src}", "--steps=1",
                               "--data.val=", f"--out_dir={out}", "--data.seq_len=16", "--resume=false"])
        self.assertNotEqual(code, 0)
        self.assertIn("num_experts_per_tok (top-k) = 4 exceeds num_local_experts = 3", err)
        self.assertEqual(os.listdir(out), [])


if __name__ == "__main__":
    unittest.main(argv=main_args(), verbosity=2)
