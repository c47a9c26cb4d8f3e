"""LoRA from the command line (issue 42, docs/lora.md): `shardlm train` with a `lora` section on a tiny
transformers Llama (tests/golden/lora/base) writes a PEFT adapter directory; `shardlm export` copies it and
`export --merge` writes the merged model; PEFT's PeftModel.from_pretrained loads the adapter onto the base
and gives the merged model's logits (fp32, <= 1e-5 relative). Bad lora keys stop with one message naming
the key."""
import json
import os
import random
import unittest

import torch

from common import ROOT, main_args, run, tmpdir, write_llmc

BASE = os.path.join(ROOT, "tests", "golden", "lora", "base")


def tiny_tokenizer(d):
    """A character-level BPE tokenizer.json of 64 pieces, the base's vocabulary."""
    from tokenizers import Tokenizer, models
    vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ")}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    return path


def config(d, lora, extra=None):
    tokens = os.path.join(d, "train.bin")
    if not os.path.exists(tokens):
        rng = random.Random(0)
        write_llmc(tokens, [rng.randrange(64) for _ in range(4096)])
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps": 3, "seed": 5,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
           "scheduler": {"type": "constant"}, "init": BASE,
           "data": {"train": tokens, "seq_len": 16}, "lora": lora, **(extra or {})}
    path = os.path.join(d, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


class Lora(unittest.TestCase):
    def export_and_load_in_peft(self, d, out, base_dir, model_class, ids, label, min_change):
        """Exports the run in `out` as an adapter and as a merged model; PEFT loads the adapter onto the
        base in `base_dir`, and its logits for `ids` equal the merged export's (fp32 <= 1e-5) and differ
        from the base's by more than `min_change`. Returns the PEFT model."""
        import peft
        code, o, e, _ = run(["export", "--run", out, "--out", os.path.join(d, "adapter")])
        self.assertEqual(code, 0, o + e)
        code, o, e, _ = run(["export", "--run", out, "--out", os.path.join(d, "merged"), "--merge", "--base", base_dir])
        self.assertEqual(code, 0, o + e)
        base = model_class.from_pretrained(base_dir, dtype=torch.float32)
        with torch.no_grad():
            plain = base(input_ids=ids).logits
            model = peft.PeftModel.from_pretrained(base, os.path.join(d, "adapter")).eval()
            adapted = model(input_ids=ids).logits
            merged = model_class.from_pretrained(os.path.join(d, "merged"), dtype=torch.float32)(input_ids=ids).logits
        err = float((adapted - merged).abs().max() / merged.abs().max())
        print(f"[ {label} ] PEFT-loaded adapter vs merged export: max relative difference {err:.3g}")
        self.assertLessEqual(err, 1e-5)
        self.assertGreater(float((adapted - plain).abs().max()), min_change)  # the adapter changes the model
        return model

    def test_trains_exports_and_peft_loads_the_adapter(self):
        d = tmpdir("lora")
        lora = {"enabled": True, "r": 4, "lora_alpha": 8, "target_modules": "all-linear",
                "init_lora_weights": False, "modules_to_save": ["lm_head"]}
        out = os.path.join(d, "run")
        code, o, e, _ = run(["train", "--config", config(d, lora), f"--out_dir={out}"])
        self.assertEqual(code, 0, o + e)
        self.assertIn("LoRA, 14 adapted linears", o + e)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            self.assertTrue(os.path.exists(os.path.join(out, f)), f)
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
        import peft
        from transformers import LlamaForCausalLM
        ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
        model = self.export_and_load_in_peft(d, out, BASE, LlamaForCausalLM, ids, "lora", 1e-3)
        # generate --adapter samples from the adapted model: greedy ids equal those of the merged export.
        gens, TOKENIZER = [], tiny_tokenizer(d)
        for args in (["--model", BASE, "--adapter", os.path.join(d, "adapter")], ["--model", os.path.join(d, "merged")]):
            code, o, e, _ = run(["generate", *args, "--tokenizer", TOKENIZER, "--prompt", "ab", "--temperature", "0",
                                 "--max-new-tokens", "8"])
            gens.append((code, o, e))
        self.assertEqual(gens[0][0], 0, gens[0][1] + gens[0][2])
        self.assertEqual(gens[0][1], gens[1][1])
        # Every tensor shardlm wrote is one PEFT loaded (no missing or unexpected names).
        from safetensors.torch import load_file
        saved = load_file(os.path.join(d, "adapter", "adapter_model.safetensors"))
        state = peft.get_peft_model_state_dict(model)
        self.assertEqual(sorted(saved), sorted(state))
        for k, t in saved.items():
            self.assertTrue(torch.equal(t, state[k]), k)

    def test_expert_adapters_train_export_and_peft_loads_them(self):
        """lora.target_parameters on a tiny Mixtral (tests/golden/lora_mixtral/base): the run's adapter, as
        exported, loads in PEFT (nested ParamWrappers on mlp.experts) with exactly the tensors written, and
        gives the logits of the merged export (per-expert W + scaling B A), fp32 <= 1e-5."""
        from transformers import MixtralForCausalLM
        import peft
        from safetensors.torch import load_file
        d = tmpdir("lora_experts")
        rng = random.Random(0)
        write_llmc(os.path.join(d, "train.bin"), [rng.randrange(32) for _ in range(2048)])
        base_dir = os.path.join(ROOT, "tests", "golden", "lora_mixtral", "base")
        lora = {"enabled": True, "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "init_lora_weights": False,
                "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                "rank_pattern": {"down_proj": 3}}
        out = os.path.join(d, "run")
        code, o, e, _ = run(["train", "--config", config(d, lora, {"init": base_dir}), f"--out_dir={out}"])
        self.assertEqual(code, 0, o + e)
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
        model = self.export_and_load_in_peft(d, out, base_dir, MixtralForCausalLM, ids, "lora experts", 1e-4)
        saved = load_file(os.path.join(d, "adapter", "adapter_model.safetensors"))
        state = peft.get_peft_model_state_dict(model)
        self.assertEqual(sorted(saved), sorted(state))
        self.assertIn("base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight", saved)
        for k, t in saved.items():
            self.assertTrue(torch.equal(t, state[k]), k)

    def test_qlora_trains_on_a_4bit_base_with_bitsandbytes_loss(self):
        """quantization.load_in_4bit (NF4, double quantization) keeps the decoder's linears in 4 bits: the
        first step's loss (B = 0, so the base's) equals transformers + bitsandbytes' 4-bit model's loss on
        the same batch (fp32 compute, <= 1e-4), which the unquantized base misses. The base here has
        linears whose input width is a multiple of 64 (64 and 128), and bitsandbytes runs in training mode:
        its AVX-512 CPU paths (a repacked eval-mode kernel, and absmax read per row when the width is a
        multiple of 16 but not of 64) would otherwise compute another 4-bit model than its own format."""
        from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
        d = tmpdir("qlora")
        base_dir = os.path.join(d, "base")
        torch.manual_seed(3)
        LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     tie_word_embeddings=False)).float().save_pretrained(base_dir)
        lora = {"enabled": True, "r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
        quant = {"init": base_dir,
                 "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32"}}
        out = os.path.join(d, "run")
        code, o, e, _ = run(["train", "--config", config(d, lora, quant), f"--out_dir={out}"])
        self.assertEqual(code, 0, o + e)
        self.assertIn("QLoRA, the base's decoder linears in nf4 with double quantization", o + e)
        self.assertTrue(os.path.exists(os.path.join(out, "adapter_model.safetensors")))
        # export --merge of a run without a tokenizer takes the base folder's with the merged weights.
        tiny_tokenizer(base_dir)
        code, o, e, _ = run(["export", "--run", out, "--out", os.path.join(d, "merged"), "--merge", "--base", base_dir])
        self.assertEqual(code, 0, o + e)
        self.assertTrue(os.path.exists(os.path.join(d, "merged", "tokenizer.json")))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            first = [json.loads(line) for line in f if '"loss"' in line][0]
        from common import read_llmc
        tokens = torch.tensor(read_llmc(os.path.join(d, "train.bin"))[2][:33])
        ids, targets = tokens[:32].reshape(2, 16), tokens[1:33].reshape(2, 16)
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.float32)
        losses = {}
        for name, kw in (("4-bit", {"quantization_config": bnb}), ("plain", {})):
            m = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32, **kw).train()
            logits = m(input_ids=ids).logits.float()
            losses[name] = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1)))
        print(f"[ qlora ] first loss {first['loss']:.7f}, bitsandbytes 4-bit {losses['4-bit']:.7f}, "
              f"unquantized {losses['plain']:.7f}")
        self.assertLessEqual(abs(first["loss"] - losses["4-bit"]), 1e-4)
        self.assertGreater(abs(first["loss"] - losses["plain"]), 1e-3)  # the base really is 4-bit
        code, o, e, _ = run(["train", "--config", config(d, {"enabled": False}, quant), f"--out_dir={d}/no_lora"])
        self.assertNotEqual(code, 0)
        self.assertIn("quantization.load_in_4bit without lora.enabled", o + e)

    def test_bad_lora_keys_name_the_key(self):
        d = tmpdir("lora_bad")
        cases = [({"enabled": True, "target_modules": ["q_proj", "nope"]}, "lora.target_modules: \"nope\" matches no"),
                 ({"enabled": True, "r": 0}, "lora.r"),
                 ({"r": 8}, "lora.r is set but lora.enabled is false"),
                 ({"enabled": True, "use_dora": True}, "lora.use_dora"),
                 ({"enabled": True, "rnak": 3}, "lora.rnak"),
                 ({"enabled": True, "target_parameters": ["mlp.experts.gate_up_proj"]},
                  "lora.target_parameters: \"mlp.experts.gate_up_proj\" matches no expert parameter")]
        for lora, message in cases:
            code, o, e, _ = run(["train", "--config", config(d, lora), f"--out_dir={os.path.join(d, 'run')}"])
            self.assertNotEqual(code, 0, lora)
            self.assertIn(message, o + e, lora)


if __name__ == "__main__":
    unittest.main(argv=main_args())
