#!/usr/bin/env python3
"""Parity cases for Llama-family features, made by the pinned transformers itself.

    /opt/shardlm/venv/bin/python tests/reference/make_family_cases.py OUT_DIR

(run with OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1; nothing is downloaded). For every case
of family_cases.py it writes OUT_DIR/<case>/ and finally OUT_DIR/cases.json:

  <case>/config.json          what `save_pretrained` writes (transformers 5.x form:
                              `rope_parameters`), or for the cases marked "4.x style"
                              that file rewritten the way transformers 4.x configs look
                              (top-level `rope_theta`, a `rope_scaling` dict with
                              `rope_type` or the legacy `type`, no `rope_parameters`);
                              transformers reads the rewritten file back to the same
                              rope parameters (checked).
  <case>/model.safetensors    `save_pretrained` (F32, HF parameter names; tied models
                              have no lm_head.weight). Weights: every parameter drawn in
                              named_parameters() order from torch.Generator(seed):
                              Linear/Embedding N(0, 0.02), q_proj/k_proj weights
                              N(0, 0.08) (attention not uniform), every bias N(0, 0.1),
                              RMSNorm weights 1 + 0.1 N(0, 1).
  <case>/generation_config.json  (save_pretrained's; irrelevant)
  <case>/parity.safetensors   input_ids I64 [B,T], targets I64 [B,T] (already shifted:
                              seq[:, :-1], seq[:, 1:] of B random rows of T+1 ids over the
                              full vocabulary), and from transformers' own model (the
                              XForCausalLM.from_pretrained(<case>) of the files above,
                              float32, eager attention): logits F32 [B,T,V], loss F32 []
                              = F.cross_entropy(logits.float().reshape(-1, V),
                              targets.reshape(-1)) (MoE cases with output_router_logits:
                              + router_aux_loss_coef * the model's aux_loss, as
                              XForCausalLM adds it; aux_loss F32 [] too), grad.<param name>
                              F32 for every named parameter (MoE: the fused expert
                              tensors transformers 5 holds; the file has one tensor per
                              expert as save_pretrained writes it, except the case
                              mixtral_fused_file, which holds the fused state_dict); and from hf_llama.py in float64 on the
                              same (float32-valued) weights: f64.logits F64, f64.loss
                              F64 [], f64.grad.<param name> F64.
  cases.json                  [{"name", "seq_len", "family", "what"}, ...] in run order.

Checks, per case: hf_llama.py (reading the case's config.json and model.safetensors) in
float32 agrees with transformers to a norm-wise relative error <= BOUND = 1e-5 (the bound
of check_transformers.py) for logits, loss and every gradient; hf_llama float32 vs float64
<= BOUND / 2 (the bound is meaningful; see NOISE_MAX); parameter names, order and shapes of hf_llama's
param_shapes() equal transformers' named_parameters(); and sensitivity: perturbing the
case's feature in hf_llama (dropping the rope scaling, the biases, widening the window,
...) moves the result by >= 100 x BOUND, so the case really tests the feature (plus a few
controls that must NOT move). Prints a table of the measured errors; exits non-zero if
any check fails; the last line is "N passed, M failed". Takes ~8 s on one core (~5 s of it
importing transformers); OUT_DIR ends up ~70 MB (llama_vocab_128k is 45 MB of it).

The cases and what each pins down of transformers' semantics: family_cases.py.
"""

import copy
import math
import json
import os
import shutil
import sys
import time
from collections import OrderedDict

T0 = time.time()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_llama  # noqa: E402
import safetensors_py  # noqa: E402
from family_cases import CASES, CONFIG_READING  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

BOUND = 1e-5  # as check_transformers.py
# hf_llama float32 vs float64 must stay well below BOUND. check_transformers.py asks for BOUND / 4;
# here the bias cases are worse conditioned (every bias ~ N(0, 0.1) dominates a residual stream of
# N(0, 0.02) embeddings, so layer 1's normalized inputs are nearly the same for every token and its
# q/k gradients are small differences): measured up to 4.3e-6 for layer-1 q/k gradients, so BOUND / 2,
# and anything above BOUND / 4 is printed as a note.
NOISE_MAX = BOUND / 2
NOISE_NOTE = BOUND / 4
SENSITIVE_MIN = 100 * BOUND
SCRIPT = "tests/reference/make_family_cases.py"

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")

PASSED, FAILED = [], []


def check(cond, msg):
    if not cond:
        print("  FAIL " + msg)
    (PASSED if cond else FAILED).append(msg)
    return cond


def rel(a, b):
    """norm-wise relative error ||a - b|| / ||b||, in float64."""
    a, b = a.detach().double(), b.detach().double()
    nb = b.norm()
    return ((a - b).norm() / nb).item() if nb > 0 else (a - b).norm().item()


def config_reading_checks():
    """hf_llama.LlamaConfig vs transformers' XConfig.from_dict on the same config.json dict
    (standardize_rope_params run once more, as every rope init function does at model build)."""
    print("== config reading: hf_llama vs transformers (from_dict, no model)")
    for family, d in CONFIG_READING:
        d = dict(d, model_type=family)
        t = FAMILIES[family][0].from_dict(copy.deepcopy(d))
        t.standardize_rope_params()
        h = hf_llama.LlamaConfig.from_dict(copy.deepcopy(d))
        tf_head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        want = dict(rope=t.rope_parameters, kv=t.num_key_value_heads, head_dim=tf_head_dim,
                    max_pos=t.max_position_embeddings, eps=t.rms_norm_eps, vocab=t.vocab_size,
                    inter=t.intermediate_size, tie=t.tie_word_embeddings, layers=t.num_hidden_layers)
        got = dict(rope=h.rope_parameters, kv=h.num_key_value_heads, head_dim=h.head_dim,
                   max_pos=h.max_position_embeddings, eps=h.rms_norm_eps, vocab=h.vocab_size,
                   inter=h.intermediate_size, tie=h.tie_word_embeddings, layers=h.num_hidden_layers)
        if family == "llama":
            want.update(qkv_bias=t.attention_bias, o_bias=t.attention_bias, mlp_bias=t.mlp_bias)
        if family == "mistral":
            want["layer_types"] = ["full_attention" if t.sliding_window is None else "sliding_attention"] * \
                t.num_hidden_layers
        if family == "qwen2":
            want["layer_types"] = t.layer_types
        if family != "llama":
            want["sliding_window"] = t.sliding_window
        got.update(qkv_bias=h.qkv_bias, o_bias=h.o_bias, mlp_bias=h.mlp_bias, layer_types=h.layer_types,
                   sliding_window=h.sliding_window)
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        check(not diff, f"config {d}: hf_llama reads what transformers reads" + (f" -- differs: {diff}" if diff
                                                                                  else ""))
    print(f"  {len(CONFIG_READING)} config dicts compared")


# --------------------------------------------------------------------------- #
def init_weights(model, seed):
    """Every parameter drawn in named_parameters() order (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            x = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith(".bias"):
                x = 0.1 * x
            elif name.endswith("norm.weight"):
                x = 1.0 + 0.1 * x
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                x = 0.08 * x
            elif name.endswith("mlp.gate.weight"):  # MoE router: routing that differs per token
                x = 0.3 * x
            else:
                x = 0.02 * x
            p.copy_(x)


def rewrite_4x(path, style):
    """config.json -> 4.x form: top-level rope_theta, rope_scaling (key `rope_type`, or `type` for
    style 'type'); style 'both' also leaves a stale rope_parameters {default, theta 1e6} that
    transformers must ignore."""
    with open(path) as f:
        d = json.load(f, object_pairs_hook=OrderedDict)
    rp = d.pop("rope_parameters")
    d["rope_theta"] = rp.pop("rope_theta")
    rope_type = rp.pop("rope_type")
    scaling = OrderedDict([("type" if style == "type" else "rope_type", rope_type)])
    scaling.update(rp)
    d["rope_scaling"] = scaling
    if style == "both":
        d["rope_parameters"] = OrderedDict([("rope_type", "default"), ("rope_theta", 1e6)])
    with open(path, "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")


def run_transformers(model, x, y):
    model.train(False)
    moe = model.config.model_type in MOE_FAMILIES
    result = model(input_ids=x, use_cache=False)
    logits = result.logits
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
    if moe and model.config.output_router_logits:
        # MixtralForCausalLM.forward: loss += self.router_aux_loss_coef * aux_loss (labels given)
        loss = loss + model.config.router_aux_loss_coef * result.aux_loss.to(loss.device)
    loss.backward()
    out = OrderedDict([("logits", logits.detach()), ("loss", loss.detach())])
    if moe and model.config.output_router_logits:
        out["aux_loss"] = result.aux_loss.detach()
    for k, p in model.named_parameters():
        out["grad." + k] = p.grad.detach().clone()
    return out


def run_hf(params, cfg, x, y, dtype):
    leaves = OrderedDict((k, v.detach().to(dtype).clone().requires_grad_(True)) for k, v in params.items())
    logits, aux = hf_llama.forward_with_aux(leaves, cfg, x)
    loss = hf_llama.loss_fn(logits, y)
    if aux is not None:
        loss = loss + cfg.router_aux_loss_coef * aux
    loss.backward()
    out = OrderedDict([("logits", logits.detach()), ("loss", loss.detach())])
    if aux is not None:
        out["aux_loss"] = aux.detach()
    for k, v in leaves.items():
        out["grad." + k] = v.grad.detach()
    return out


EXPERT_FILE_PARTS = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
                     "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
                     "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj")}


def expert_file_names(shapes, family):
    """The tensor names save_pretrained writes for a model whose named_parameters are `shapes`
    (transformers' conversion_mapping reversed: one tensor per expert; mixtral's block renamed)."""
    if family not in MOE_FAMILIES:
        return sorted(shapes)
    block, g, u, d = EXPERT_FILE_PARTS[family]
    names = []
    for k, shape in shapes.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("mlp.experts.gate_up_proj")] + block + ".experts."
            names += [f"{pre}{e}.{p}.weight" for e in range(shape[0]) for p in (g, u)]
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("mlp.experts.down_proj")] + block + ".experts."
            names += [f"{pre}{e}.{d}.weight" for e in range(shape[0])]
        elif family == "mixtral" and k.endswith("mlp.gate.weight"):
            names.append(k.replace(".mlp.", ".block_sparse_moe."))
        else:
            names.append(k)
    return sorted(names)


def fuse_experts(on_disk, shapes, family):
    """Per-expert file tensors -> the fused parameters (transformers' MergeModulelist(dim=0) +
    Concatenate(dim=1) for gate_up = [gate; up] per expert), written independently of shardlm."""
    if family not in MOE_FAMILIES:
        return on_disk
    block, g, u, d = EXPERT_FILE_PARTS[family]
    out = {}
    for k, shape in shapes.items():
        if k in on_disk:
            out[k] = on_disk[k]
        elif k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("mlp.experts.gate_up_proj")] + block + ".experts."
            gate = torch.stack([on_disk[f"{pre}{e}.{g}.weight"] for e in range(shape[0])])
            up = torch.stack([on_disk[f"{pre}{e}.{u}.weight"] for e in range(shape[0])])
            out[k] = torch.cat([gate, up], dim=1)
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("mlp.experts.down_proj")] + block + ".experts."
            out[k] = torch.stack([on_disk[f"{pre}{e}.{d}.weight"] for e in range(shape[0])])
        elif family == "mixtral" and k.endswith("mlp.gate.weight"):
            out[k] = on_disk[k.replace(".mlp.", ".block_sparse_moe.")]
    return out


def worst(a, b):
    """The largest relative difference over b's tensors and its name; a NaN one first (max() skips NaN)."""
    rels = [(k, rel(a[k], b[k])) for k in b]
    k, v = next(((k, v) for k, v in rels if math.isnan(v)), None) or max(rels, key=lambda kv: kv[1])
    return v, k


def build_case(c, out_dir, results):
    name, family, T, B = c["name"], c["family"], c["seq_len"], c["batch"]
    seed = c["seed"] if c["seed"] is not None else 1000 + [cc["name"] for cc in CASES].index(name)
    cdir = os.path.join(out_dir, name)
    if os.path.exists(cdir):
        shutil.rmtree(cdir)
    cfg_cls, model_cls = FAMILIES[family]
    print(f"== {name} ({family}, T={T}, B={B}, seed {seed}): {c['what']}")

    # 1. transformers model, seeded weights, save_pretrained (+ 4.x rewrite), reload
    hf_cfg = cfg_cls(**copy.deepcopy(c["cfg"]), attn_implementation="eager")
    torch.manual_seed(seed)
    model = model_cls(hf_cfg).to(torch.float32)
    init_weights(model, seed)
    model.save_pretrained(cdir)
    if c.get("fused_file"):
        # the in-memory state_dict of transformers 5 (fused experts), as a file
        safetensors_py.save_file(OrderedDict((k, v.detach().contiguous()) for k, v in model.state_dict().items()
                                             if not (hf_cfg.tie_word_embeddings and k == "lm_head.weight")),
                                 os.path.join(cdir, "model.safetensors"), {"format": "pt"})
    want_rope = dict(model.config.rope_parameters)
    if c["style4x"]:
        rewrite_4x(os.path.join(cdir, "config.json"), c["style4x"])
    loaded = model_cls.from_pretrained(cdir, attn_implementation="eager", dtype=torch.float32)
    got_rope = {k: v for k, v in loaded.config.rope_parameters.items() if k != "type"}
    check(got_rope == want_rope, f"{name}: transformers reads config.json back to rope_parameters {want_rope} "
          f"(got {got_rope})")
    check(loaded.config._attn_implementation == "eager", f"{name}: eager attention")
    ref_params = dict(model.named_parameters())
    tf_params = OrderedDict(loaded.named_parameters())
    check(list(tf_params) == list(ref_params) and all(torch.equal(tf_params[k], ref_params[k]) for k in tf_params),
          f"{name}: reloaded parameters equal the saved ones")
    if hf_cfg.tie_word_embeddings:
        check(loaded.lm_head.weight is loaded.model.embed_tokens.weight, f"{name}: lm_head tied")

    # 2. batch
    gen = torch.Generator().manual_seed(seed + 1)
    V = hf_cfg.vocab_size
    seq = torch.randint(0, V, (B, T + 1), generator=gen, dtype=torch.int64)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    if c.get("min_ids_above_65535"):
        n_big = int((seq > 65535).sum())
        check(n_big >= c["min_ids_above_65535"], f"{name}: {n_big} token ids > 65535 in the batch")

    # 3. transformers forward / backward
    tf = run_transformers(loaded, x, y)

    # 4. hf_llama from the files on disk, float32 and float64
    cfg = hf_llama.LlamaConfig.from_json_file(os.path.join(cdir, "config.json"))
    on_disk, _ = safetensors_py.load_file(os.path.join(cdir, "model.safetensors"))
    shapes = hf_llama.param_shapes(cfg)
    check(list(shapes.items()) == [(k, tuple(p.shape)) for k, p in tf_params.items()],
          f"{name}: hf_llama param_shapes == transformers named_parameters (names, order, shapes)")
    want_names = sorted(shapes) if c.get("fused_file") else expert_file_names(shapes, family)
    check(sorted(on_disk) == want_names, f"{name}: model.safetensors holds exactly those tensors"
          + (" (one per expert)" if family in MOE_FAMILIES and not c.get("fused_file") else ""))
    on_disk = fuse_experts(on_disk, shapes, family)
    params = OrderedDict((k, on_disk[k]) for k in shapes if k in on_disk)
    check(cfg.rope_parameters == {k: v for k, v in loaded.config.rope_parameters.items()},
          f"{name}: hf_llama reads the same rope_parameters as transformers")
    if family == "qwen2":
        check(cfg.layer_types == loaded.config.layer_types and cfg.sliding_window == loaded.config.sliding_window,
              f"{name}: same layer_types {cfg.layer_types} and sliding_window {cfg.sliding_window}")
    elif family == "mistral":
        check(cfg.sliding_window == loaded.config.sliding_window, f"{name}: same sliding_window")
    h32 = run_hf(params, cfg, x, y, torch.float32)
    h64 = run_hf(params, cfg, x, y, torch.float64)

    e_tf, k_tf = worst(h32, tf)
    e_tf64, k_tf64 = worst(tf, h64)
    e_noise, k_noise = worst(h32, h64)
    bitwise = all(torch.equal(h32[k], tf[k]) for k in tf)
    check(sorted(h32) == sorted(tf), f"{name}: same tensors from hf_llama and transformers ({len(tf)})")
    check(e_tf <= BOUND, f"{name}: hf_llama f32 vs transformers worst {e_tf:.2e} ({k_tf}) <= {BOUND:.0e}")
    check(e_noise <= NOISE_MAX, f"{name}: hf_llama f32 vs f64 worst {e_noise:.2e} ({k_noise}) <= {NOISE_MAX:.1e}")
    if e_noise > NOISE_NOTE:
        noisy = [(k, rel(h32[k], h64[k])) for k in h64]
        noisy = ", ".join(f"{k} {e:.1e}" for k, e in sorted(noisy, key=lambda kv: -kv[1]) if e > NOISE_NOTE)
        print(f"  note: f32-vs-f64 noise above BOUND/4 = {NOISE_NOTE:.1e} in: {noisy}")

    # feature-specific facts
    if c.get("llama3_bands"):
        bands = hf_llama.llama3_bands(cfg)
        bands64 = hf_llama.llama3_bands(cfg, torch.float64)
        check(all(b in bands for b in ("high", "medium", "low")) and bands == bands64,
              f"{name}: frequencies in all three llama3 bands, same in f32 and f64: {bands}")
    if c.get("dynamic_base_info"):
        # how much the float32-tensor NTK base matters: the same frequencies with the base in double
        inv32, _ = hf_llama.rope_for_forward(cfg, torch.arange(T)[None], torch.float32)
        inv_d, _ = hf_llama.rope_init(cfg, torch.float32, seq_len=T)  # Python int: base in double
        print(f"  info: NTK base as float32 tensor vs Python double: inv_freq rel diff {rel(inv32, inv_d):.2e}")
    if c.get("same_as"):
        other = results[c["same_as"]]["tf"]
        check(all(torch.equal(tf[k], other[k]) for k in tf),
              f"{name}: transformers' results bitwise equal to {c['same_as']}'s (same math, other config form)")

    # sensitivity
    sens = []
    for p in c["perturb"]:
        pcfg, pparams, px, py = p["fn"](cfg, params, x, y)
        pr = run_hf(pparams, pcfg, px, py, torch.float32)
        d = rel(pr[p["key"]], tf[p["key"]])
        sens.append((p["desc"], d))
        if p["expect"] == "moves":
            check(d >= SENSITIVE_MIN, f"{name}: sensitivity '{p['desc']}': {p['key']} moves {d:.2e} >= "
                  f"{SENSITIVE_MIN:.0e}")
        elif p["expect"] == "bitwise":
            check(torch.equal(pr[p["key"]], h32[p["key"]]), f"{name}: {p['desc']} ({p['key']} diff {d:.1e})")
        else:
            check(d <= BOUND, f"{name}: {p['desc']} ({p['key']} diff {d:.1e} <= {BOUND:.0e})")
    for desc, d in sens:
        print(f"  sensitivity {desc:<58} {d:.2e}")
    print(f"  f32 hf_llama vs transformers {e_tf:.2e} (bitwise {bitwise}); transformers vs f64 {e_tf64:.2e}; "
          f"hf_llama f32 vs f64 {e_noise:.2e}")

    # 5. parity file
    parity = OrderedDict()
    parity["input_ids"] = x
    parity["targets"] = y
    parity["logits"] = tf["logits"].float()
    parity["loss"] = tf["loss"].float().reshape(())
    if "aux_loss" in tf:
        parity["aux_loss"] = tf["aux_loss"].float().reshape(())
        parity["f64.aux_loss"] = h64["aux_loss"].reshape(())
    for k in tf_params:
        parity["grad." + k] = tf["grad." + k].float()
    parity["f64.logits"] = h64["logits"]
    parity["f64.loss"] = h64["loss"].reshape(())
    for k in tf_params:
        parity["f64.grad." + k] = h64["grad." + k]
    md = OrderedDict([
        ("generator", SCRIPT),
        ("transformers_version", transformers.__version__),
        ("torch_version", torch.__version__),
        ("case", name),
        ("contents", f"{name}: {c['what']}. input_ids/targets (shifted) from torch.Generator seed {seed + 1}; "
                     "logits/loss/grad.* from transformers' " + model_cls.__name__ + " (float32, eager) on "
                     "model.safetensors; loss = mean cross-entropy over all B*T tokens; f64.* from hf_llama.py "
                     "in float64 on the same weights"),
        ("max_rel_err_hf_llama_f32_vs_transformers", "%.3e" % e_tf),
        ("max_rel_err_f32_vs_f64", "%.3e" % e_tf64),
    ])
    safetensors_py.save_file(parity, os.path.join(cdir, "parity.safetensors"), md)
    results[name] = dict(tf=tf, e_tf=e_tf, e_tf64=e_tf64, e_noise=e_noise, bitwise=bitwise,
                         sens=min((d for p, (_, d) in zip(c["perturb"], sens) if p["expect"] == "moves"),
                                  default=float("nan")))


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.split("\n\n")[1])
        sys.exit(2)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; import {time.time() - T0:.1f} s")
    results = OrderedDict()
    config_reading_checks()
    for c in CASES:
        n_failed = len(FAILED)
        try:
            build_case(c, out_dir, results)
        except Exception as e:  # a case that cannot be built is a failure, not a crash of the others
            import traceback
            traceback.print_exc()
            check(False, f"{c['name']}: {type(e).__name__}: {e}")
        if len(FAILED) == n_failed:
            print("  ok")

    cases_json = [OrderedDict([("name", c["name"]), ("seq_len", c["seq_len"]), ("family", c["family"]),
                               ("what", c["what"])]) for c in CASES]
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(cases_json, f, indent=2)
        f.write("\n")

    print("\nnorm-wise relative errors (worst over logits, loss and every gradient)")
    print(f"  {'case':<24}{'family':<9}{'T':>4}{'f32 hf_llama-tf':>17}{'bitwise':>9}{'tf-f64':>11}"
          f"{'hf_llama f32-f64':>18}{'least sensitivity':>19}")
    for c in CASES:
        r = results.get(c["name"])
        if r is None:
            print(f"  {c['name']:<24}{c['family']:<9}{c['seq_len']:>4}   (not built)")
            continue
        print(f"  {c['name']:<24}{c['family']:<9}{c['seq_len']:>4}{r['e_tf']:>17.2e}{str(r['bitwise']):>9}"
              f"{r['e_tf64']:>11.2e}{r['e_noise']:>18.2e}{r['sens']:>19.2e}")
    print(f"(bound {BOUND:.0e}; f32-vs-f64 noise must stay <= BOUND/2 = {NOISE_MAX:.1e}; a perturbed feature must move "
          f">= {SENSITIVE_MIN:.0e})")
    print(f"\nwrote {len(results)} cases under {out_dir}; run time {time.time() - T0:.1f} s")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
