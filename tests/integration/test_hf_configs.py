"""Public config.json files as users bring them (tests/data/hf_configs, sources in its SOURCES.md),
and bad ones: each public Llama/Mistral/Qwen2/Qwen3/Mixtral-family config is planned by `shardlm plan
--model` with the parameter count transformers' own model class has for it (built on the meta device,
no memory), each of its keys used or named on one `ignored keys` line (exactly the keys the pinned
transformers does not read for that model type either); a config of another family is refused naming
why; a config with a key transformers reads that shardlm does not know, an unsupported rope type or
activation, or missing shape keys is refused naming key and value.

    /opt/shardlm/venv/bin/python tests/integration/test_hf_configs.py build/shardlm
"""
import glob
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args, run, tmpdir  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

import make_hf_config_reads  # noqa: E402  (tests/reference, on sys.path through common)

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "hf_configs", "*.json")))
FAMILIES = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe"}
# Public configs shardlm refuses, and the words of the reason it must give.
REFUSED = {"phi-3-mini-128k-instruct.json": 'model_type is "phi3"'}


def transformers_parameter_count(cfg_json):
    config = transformers.AutoConfig.for_model(**cfg_json)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def transformers_reading(cfg_json):
    """What transformers makes of the file: the values the model's math depends on."""
    c = transformers.AutoConfig.for_model(**cfg_json)
    rope = dict(c.rope_parameters)
    rope.pop("type", None)
    windows = []
    for i in range(c.num_hidden_layers):
        if c.model_type in ("mistral", "mixtral"):
            windows.append(c.sliding_window)
        elif c.model_type == "qwen2":
            windows.append(c.sliding_window if c.layer_types[i] == "sliding_attention" else None)
        else:
            windows.append(None)
    experts = None  # (experts, top-k, renormalised, expert width, shared width, sparse layers)
    if c.model_type == "mixtral":
        experts = (c.num_local_experts, c.num_experts_per_tok, True, c.intermediate_size, 0,
                   list(range(c.num_hidden_layers)))
    elif c.model_type in ("qwen2_moe", "qwen3_moe"):
        experts = (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob, c.moe_intermediate_size,
                   getattr(c, "shared_expert_intermediate_size", 0),
                   [i for i in range(c.num_hidden_layers) if i not in c.mlp_only_layers and c.num_experts > 0
                    and (i + 1) % c.decoder_sparse_step == 0])
    return {"head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads, "experts": experts,
            "num_key_value_heads": c.num_key_value_heads, "rope": rope, "windows": windows,
            "tie_word_embeddings": c.tie_word_embeddings, "max_position_embeddings": c.max_position_embeddings,
            "rms_norm_eps": c.rms_norm_eps}


def shardlm_reading(model):
    """The same values from the model section shardlm writes (`plan --emit-config`)."""
    rope = dict(model["rope_parameters"])
    windows = []
    for i in range(model["num_hidden_layers"]):
        w = model.get("sliding_window")
        if model["model_type"] == "qwen2":
            types = model.get("layer_types") or ["sliding_attention" if i >= model["max_window_layers"] else
                                                 "full_attention" for i in range(model["num_hidden_layers"])]
            w = w if model["use_sliding_window"] and types[i] == "sliding_attention" else None
        windows.append(w)
    experts = None
    if model["model_type"] == "mixtral":
        experts = (model["num_local_experts"], model["num_experts_per_tok"], True, model["intermediate_size"], 0,
                   list(range(model["num_hidden_layers"])))
    elif model["model_type"] in ("qwen2_moe", "qwen3_moe"):
        experts = (model["num_experts"], model["num_experts_per_tok"], model["norm_topk_prob"],
                   model["moe_intermediate_size"], model.get("shared_expert_intermediate_size", 0),
                   [i for i in range(model["num_hidden_layers"]) if i not in model["mlp_only_layers"]
                    and model["num_experts"] > 0 and (i + 1) % model["decoder_sparse_step"] == 0])
    return {"head_dim": model["head_dim"], "num_key_value_heads": model["num_key_value_heads"], "rope": rope,
            "experts": experts,
            "windows": windows, "tie_word_embeddings": model["tie_word_embeddings"],
            "max_position_embeddings": model["max_position_embeddings"], "rms_norm_eps": model["rms_norm_eps"]}


def shardlm_keys():
    """{family: keys of shardlm's table (honoured or math-neutral)} from `plan --hf-keys`."""
    code, out, err, _ = run(["plan", "--hf-keys"])
    assert code == 0, err
    keys = {f: set() for f in FAMILIES}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[1].startswith("`"):
            continue
        for f in (FAMILIES if cells[2] == "all" else cells[2].split()):
            keys[f].add(cells[1].strip("`"))
    return keys


def ignored_named(err):
    """The keys the `ignored key(s) a, b: ...` line of plan's stderr names."""
    named = set()
    for line in err.splitlines():
        for lead in ("ignored keys ", "ignored key "):
            at = line.find(": " + lead)
            if at >= 0:
                named |= {k.strip() for k in line[at + 2 + len(lead):].split(": ")[0].split(",")}
    return named


def plan(path):
    code, out, err, _ = run(["plan", "--model", path, "--devices", "8", "--json"])
    return code, (json.loads(out) if code == 0 else None), err


PLANNED = {}


def plan_public(path):
    """plan() of a public config and the model section its `--emit-config` writes (None when refused),
    from one `shardlm plan` run per file that both PublicConfigs tests read."""
    if path not in PLANNED:
        emitted = os.path.join(tmpdir("emit"), "train.json")
        code, out, err, _ = run(["plan", "--model", path, "--devices", "8", "--json", "--emit-config", emitted])
        model = None
        if code == 0:
            with open(emitted) as f:
                model = json.load(f)["model"]
        PLANNED[path] = (code, json.loads(out) if code == 0 else None, err, model)
    return PLANNED[path]


class PublicConfigs(unittest.TestCase):
    def test_the_configs_the_issue_names_are_present(self):
        names = {os.path.basename(p) for p in CONFIGS}
        for need in ["llama-2-7b.json", "llama-3-8b.json", "smollm2-360m.json", "llama-3.3-70b-instruct.json", "llama-3.1-8b.json", "llama-3.1-405b.json", "llama-3.2-1b.json",
                     "tinyllama-1.1b-chat-v1.0.json", "mistral-7b-v0.1.json", "mistral-nemo-instruct-2407.json",
                     "qwen2.5-0.5b.json"]:
            self.assertIn(need, names)

    def test_every_key_is_used_or_named_as_ignored(self):
        """Each key of each public config is in shardlm's table (honoured or math-neutral), or named on
        the one `ignored keys` line, which names exactly the keys transformers does not read either
        (make_hf_config_reads.py's table of the pinned transformers); auto_map gets its own notice."""
        table, reads = shardlm_keys(), make_hf_config_reads.table()
        ignored_somewhere = 0
        for path in CONFIGS:
            name = os.path.basename(path)
            if name in REFUSED:
                continue
            with open(path) as f:
                cfg = json.load(f)
            family = cfg.get("model_type", "llama")
            with self.subTest(config=name):
                code, _, err, _ = plan_public(path)
                self.assertEqual(code, 0, f"{name}: {err}")
                unread = {k for k in cfg if k not in table[family] and k not in reads[family]}
                self.assertEqual(ignored_named(err), unread, f"{name}: {err}")
                self.assertEqual(set(cfg) - table[family] - unread, set(), name)  # nothing else unknown
                if "auto_map" in cfg:
                    self.assertIn("no custom code runs", err)
                ignored_somewhere += bool(unread)
        self.assertGreaterEqual(ignored_somewhere, 8, "the Neuron and Tenstorrent configs carry keys transformers ignores")

    def test_every_family_config_is_planned_with_transformers_parameter_count(self):
        planned = 0
        for path in CONFIGS:
            name = os.path.basename(path)
            with open(path) as f:
                cfg = json.load(f)
            with self.subTest(config=name):
                code, p, err, model = plan_public(path)
                if name in REFUSED:
                    self.assertNotEqual(code, 0, name)
                    self.assertIn(REFUSED[name], err)
                    continue
                self.assertIn(cfg.get("model_type", "llama"), FAMILIES, f"{name}: add it to REFUSED with its reason")
                self.assertEqual(code, 0, f"{name}: {err}")
                want = transformers_parameter_count(cfg)
                self.assertEqual(p["parameters"], want, name)
                self.assertEqual(shardlm_reading(model), transformers_reading(cfg), name)
                print(f"  {name:40s} {want / 1e9:8.3f}B parameters, as transformers counts them")
                planned += 1
        self.assertGreaterEqual(planned, 29)


def tiny(**over):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


class BadConfigs(unittest.TestCase):
    def refused(self, cfg, *words):
        d = tmpdir("badcfg")
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        code, _, err = plan(path)
        self.assertNotEqual(code, 0, f"{cfg} was accepted")
        for w in words:
            self.assertIn(w, err)
        self.assertEqual(os.listdir(d), ["config.json"], "nothing is written")
        return err

    def test_unknown_key_transformers_reads_is_named_with_its_value(self):
        # masking_utils.py reads attention_chunk_size (chunked attention): a key shardlm does not know.
        self.refused(tiny(attention_chunk_size=128), "'attention_chunk_size'", "128")
        self.refused(tiny(is_causal=False), "'is_causal'", "false")

    def test_key_transformers_never_reads_is_accepted_naming_it(self):
        d = tmpdir("ignored")
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(tiny(use_fancy_attention=True, selective_checkpoint_enabled=False,
                           auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"}), f)
        code, _, err = plan(path)
        self.assertEqual(code, 0, err)
        self.assertEqual(ignored_named(err), {"use_fancy_attention", "selective_checkpoint_enabled"}, err)
        self.assertEqual(sum("ignored key" in line for line in err.splitlines()), 1, "one line names them")
        self.assertIn("transformers " + transformers.__version__, err)
        self.assertIn("auto_map", err)
        self.assertIn("no custom code runs", err)

    def test_unsupported_rope_type_is_named(self):
        self.refused(tiny(rope_scaling={"rope_type": "mrope", "mrope_section": [8, 8]}), '"mrope"', "rope_scaling")

    def test_rope_key_the_type_does_not_read_is_named(self):
        self.refused(tiny(rope_parameters={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
                     "low_freq_factor", '"linear"')

    def test_unsupported_activation_is_named(self):
        self.refused(tiny(hidden_act="gelu"), "hidden_act", '"gelu"')

    def test_attention_dropout_above_zero_is_refused(self):
        self.refused(tiny(attention_dropout=0.1), "attention_dropout", "0.1")

    def test_missing_shape_keys_are_named(self):
        self.refused(tiny(hidden_size=None, num_hidden_layers=None), "hidden_size", "num_hidden_layers")

    def test_sliding_window_in_a_llama_config_is_refused(self):
        self.refused(tiny(sliding_window=4096), "sliding_window", "mistral")

    def test_another_head_is_refused(self):
        self.refused(tiny(architectures=["LlamaForSequenceClassification"]), "LlamaForSequenceClassification")

    def test_moe_top_k_above_the_expert_count_is_named(self):
        moe = tiny(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4, num_experts_per_tok=6)
        self.refused(moe, "num_experts_per_tok (top-k) = 6 exceeds num_local_experts = 4")

    def test_moe_router_jitter_is_refused(self):
        moe = tiny(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4,
                   router_jitter_noise=0.1)
        self.refused(moe, "router_jitter_noise", "0.1")

    def test_qwen2_moe_sliding_window_is_refused(self):
        moe = tiny(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=4,
                   moe_intermediate_size=32, shared_expert_intermediate_size=48, use_sliding_window=True)
        self.refused(moe, "use_sliding_window", "qwen2_moe")

    def test_partial_rotary_factor_is_refused(self):
        self.refused(tiny(partial_rotary_factor=0.5), "partial_rotary_factor", "0.5")

    def test_neutral_and_honoured_keys_are_listed(self):
        code, out, err, _ = run(["plan", "--hf-keys"])
        self.assertEqual(code, 0, err)
        for key in ["rope_parameters", "sliding_window", "use_cache", "torch_dtype", "pretraining_tp"]:
            self.assertIn(f"`{key}`", out)


if __name__ == "__main__":
    unittest.main(argv=main_args(), verbosity=2)
