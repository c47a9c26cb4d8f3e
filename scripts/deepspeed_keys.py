#!/usr/bin/env python3
"""Every config key the pinned DeepSpeed reads, and the shardlm row that answers it (issue 24 item 6).

A DeepSpeed config may hold any key DeepSpeed itself accepts; shardlm must answer each one with a
row of src/train/keys/ (honoured, an older name, accepted with a notice, or refused naming
the values that turn it off), never "unknown key". This script reads DeepSpeed's source without
importing it (Python's ast), so DeepSpeed need not be installed:

  * the pydantic config models (DeepSpeedConfigModel subclasses), each field under its name and
    under its alias (DeepSpeed sets populate_by_name, so both are read), deprecated fields included,
    nested models followed, each model rooted where runtime/config.py and its helpers build it from
    the config (`Model(**param_dict["section"])`);
  * the plain dictionary reads of the config readers listed in READERS below
    (`get_scalar_param(d, KEY, ...)`, `d.get(KEY)`, `d[KEY]`, `KEY in d`, `d.pop(KEY)`), with the
    constants (runtime/constants.py and the other constants files) resolved to their strings;
  * the keyword arguments of the optimizer and scheduler constructors DeepSpeed builds from
    `optimizer.params` and `scheduler.params` (FusedAdam, FusedLamb, runtime/lr_schedules.py), and
    the params its engine pops itself.

It writes tests/data/deepspeed/KEYS.md: each key, the DeepSpeed file it is read in, and the shardlm
row that answers it (the key's own row, or the row of the section DeepSpeed reads as one unit) with
that row's kind. tests/unit/train/test_deepspeed_keys.cpp checks the file against the key table, so
a key without a row, or a row whose kind changed, fails CI.

Rerun it after changing the table or the DeepSpeed pin (scripts/requirements-peers.txt):

  /opt/shardlm/venv/bin/pip download deepspeed==0.19.8 --no-deps --no-binary :all: -d /tmp/ds
  tar xzf /tmp/ds/deepspeed-0.19.8.tar.gz -C /tmp/ds
  python3 scripts/deepspeed_keys.py --deepspeed /tmp/ds/deepspeed-0.19.8 --shardlm build/shardlm

A reader this script does not know (a new `get_scalar_param` call whose dictionary it cannot place)
stops it with the file and line, so a DeepSpeed update cannot drop keys without a word.
"""
import argparse
import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Files whose pydantic models and dictionary reads make up the training config (the inference
# configs, deepspeed/inference, are DeepSpeed-Inference's and not part of a training config).
FILES = [
    "runtime/config.py", "runtime/constants.py", "runtime/config_utils.py", "runtime/precision_config.py",
    "runtime/zero/config.py", "runtime/zero/offload_config.py", "runtime/zero/leaf_module_config.py",
    "runtime/zenflow/zenflow_config.py", "runtime/activation_checkpointing/config.py", "comm/config.py",
    "comm/constants.py", "monitor/config.py", "compile/config.py", "profiling/config.py",
    "profiling/constants.py", "autotuning/config.py", "autotuning/constants.py", "datastates/config.py",
    "runtime/swap_tensor/aio_config.py", "runtime/swap_tensor/constants.py",
    "runtime/model_checkpointing/config.py", "runtime/model_checkpointing/constants.py",
    "runtime/tensor_parallel/config.py", "runtime/data_pipeline/config.py", "runtime/data_pipeline/constants.py",
    "utils/config.py", "inference/config.py", "module_inject/auto_ep_config.py", "runtime/engine.py",
    "runtime/pipe/engine.py",
]

# The config readers that take a dictionary of the config: (file, function) -> {argument: section}
# ("" is the config's top level). Dictionaries derived from these inside the function
# (`x = d[KEY]`, `d.get(KEY, {})`) are followed.
READERS = {
    ("runtime/config.py", "*"): {"param_dict": "", "config": "", "checkpoint_params": "checkpoint",
                                 "data_types_params": "data_types", "par_write_params": "checkpoint.parallel_write"},
    ("runtime/config.py", "_do_warning_check"): {"self._param_dict": ""},
    ("runtime/zero/config.py", "*"): {"param_dict": ""},
    ("runtime/precision_config.py", "*"): {"param_dict": ""},
    ("runtime/activation_checkpointing/config.py", "__init__"): {"param_dict": ""},
    ("runtime/activation_checkpointing/config.py", "_initialize"): {"act_chkpt_config_dict": "activation_checkpointing"},
    ("comm/config.py", "*"): {"ds_config": ""},
    ("monitor/config.py", "*"): {"param_dict": ""},
    ("profiling/config.py", "__init__"): {"param_dict": ""},
    ("profiling/config.py", "_initialize"): {"flops_profiler_dict": "flops_profiler"},
    ("autotuning/config.py", "__init__"): {"param_dict": ""},
    ("autotuning/config.py", "_initialize"): {"autotuning_dict": "autotuning"},
    ("autotuning/config.py", "get_model_info_config"): {"param_dict": "autotuning"},
    ("datastates/config.py", "*"): {"param_dict": ""},
    ("runtime/swap_tensor/aio_config.py", "*"): {"param_dict": ""},
    ("runtime/model_checkpointing/config.py", "get_checkpoint_config"): {"param_dict": ""},
    ("runtime/model_checkpointing/config.py", "get_checkpoint_writer_config"): {"param_dict": "checkpoint"},
    ("runtime/tensor_parallel/config.py", "*"): {"ds_config": ""},
    ("utils/config.py", "*"): {"param_dict": ""},
    ("module_inject/auto_ep_config.py", "parse_autoep_config"): {"param_dict": "expert_parallel"},
    ("runtime/data_pipeline/config.py", "get_data_efficiency_config"): {"param_dict": ""},
    ("runtime/data_pipeline/config.py", "get_data_efficiency_enabled"): {"param_dict": ""},
    ("runtime/data_pipeline/config.py", "get_data_efficiency_seed"): {"param_dict": ""},
    ("runtime/data_pipeline/config.py", "get_data_sampling"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_data_sampling_enabled"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_data_sampling_num_epochs"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_data_sampling_num_workers"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_data_sampling_pin_memory"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_curriculum_learning"): {"param_dict": "data_efficiency.data_sampling"},
    ("runtime/data_pipeline/config.py", "get_curriculum_learning_enabled"):
        {"param_dict": "data_efficiency.data_sampling"},
    ("runtime/data_pipeline/config.py", "get_dynamic_batching"): {"param_dict": "data_efficiency.data_sampling",
                                                                   "output": "data_efficiency.data_sampling.dynamic_batching"},
    ("runtime/data_pipeline/config.py", "get_data_routing"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_data_routing_enabled"): {"param_dict": "data_efficiency"},
    ("runtime/data_pipeline/config.py", "get_random_ltd"): {"param_dict": "data_efficiency.data_routing"},
    ("runtime/data_pipeline/config.py", "get_random_ltd_enabled"): {"param_dict": "data_efficiency.data_routing"},
    ("runtime/engine.py", "_configure_basic_optimizer"): {"optimizer_parameters": "optimizer.params"},
    ("runtime/engine.py", "get_optimizer_configuration"): {"optimizer_parameters": "optimizer.params"},
    ("runtime/pipe/engine.py", "*"): {"self._config.pipeline": "pipeline"},
}
# Functions whose every dictionary argument is a copy the function fills in itself, not a read of
# the config (the data pipeline copies its sub-dictionaries and adds its resolved values to them).
OUTPUT_NAMES = {"output", "checkpoint_config", "writer_config", "aio_config", "default_pipeline",
                "curriculum_learning_params", "random_ltd_params", "model_info_config"}

# Constructors whose keyword arguments are the keys of a params section: DeepSpeed passes
# `optimizer.params` to the optimizer it builds for type Adam/AdamW (FusedAdam) or Lamb (FusedLamb)
# and `scheduler.params` to the scheduler class named by scheduler.type.
CONSTRUCTORS = [
    ("ops/adam/fused_adam.py", "FusedAdam", "optimizer.params"),
    ("ops/lamb/fused_lamb.py", "FusedLamb", "optimizer.params"),
    ("runtime/lr_schedules.py", "LRRangeTest", "scheduler.params"),
    ("runtime/lr_schedules.py", "OneCycle", "scheduler.params"),
    ("runtime/lr_schedules.py", "WarmupLR", "scheduler.params"),
    ("runtime/lr_schedules.py", "WarmupDecayLR", "scheduler.params"),
    ("runtime/lr_schedules.py", "WarmupCosineLR", "scheduler.params"),
]
NOT_KEYS = {"self", "params", "model_params", "optimizer"}


class Keys:
    def __init__(self):
        self.where = {}  # dotted key -> the DeepSpeed file that reads it

    def add(self, key, path):
        key = key.strip(".")
        if key and key not in self.where:
            self.where[key] = path


def constants(trees):
    """Module-level NAME = "string" assignments of every parsed file (later files do not overwrite)."""
    out = {}
    for tree in trees.values():
        mine = {}  # a file's last assignment wins (constants.py assigns some names a format text first)
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        mine[t.id] = node.value.value
        for k, v in mine.items():
            out.setdefault(k, v)
        for node in tree.body:  # NAME = {KEY: default, ...}: the keys, for loops over them
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                names = [const_str(k, {**out, **mine}) for k in node.value.keys]
                if names and all(names):
                    out.setdefault("dict:" + node.targets[0].id, names)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):  # class ValidationMode: WARN = "WARN"
                for sub in node.body:
                    if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Constant):
                        for t in sub.targets:
                            if isinstance(t, ast.Name):
                                out.setdefault(node.name + "." + t.id, sub.value.value)
    return out


def const_str(node, consts):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return consts.get(node.value.id + "." + node.attr)
    return None


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return base and base + "." + node.attr
    return None


class ReaderWalk(ast.NodeVisitor):
    """The dictionary reads of one config-reading function."""

    def __init__(self, rel, sections, consts, keys):
        self.rel, self.sections, self.consts, self.keys = rel, dict(sections), dict(consts), keys
        self.dicts = {k[len("dict:"):]: v for k, v in consts.items() if k.startswith("dict:")}
        self.loops = {}

    def visit_FunctionDef(self, node):  # get_communication_data_type(param_dict, comm_type=COMMUNICATION_DATA_TYPE)
        args = node.args.args
        for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults):
            value = const_str(default, self.consts)
            if value is not None:
                self.consts[arg.arg] = value
        self.generic_visit(node)

    def section_of(self, node):
        name = dotted(node)
        if name in self.sections:
            return self.sections[name]
        if isinstance(node, ast.Subscript):
            base = self.section_of(node.value)
            k = const_str(node.slice, self.consts)
            if base is not None and k is not None:
                return (base + "." + k).strip(".")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            base = self.section_of(node.func.value)
            k = const_str(node.args[0], self.consts)
            if base is not None and k is not None:
                return (base + "." + k).strip(".")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("keys", "items"):
            return self.section_of(node.func.value)
        if isinstance(node, ast.Call) and dotted(node.func) in ("copy.copy", "copy.deepcopy", "dict") and node.args:
            return self.section_of(node.args[0])
        if isinstance(node, ast.BoolOp):  # dict(self.optimizer_params() or {})
            for v in node.values:
                s = self.section_of(v)
                if s is not None:
                    return s
        return None

    def visit_For(self, node):  # for key, default in MODEL_INFO_KEY_DEFAULT_DICT.items(): d[key]
        it = node.iter.func.value if isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Attribute) \
            else node.iter
        target = node.target.elts[0] if isinstance(node.target, ast.Tuple) else node.target
        if isinstance(it, ast.Name) and it.id in self.dicts and isinstance(target, ast.Name):
            self.loops[target.id] = self.dicts[it.id]
        self.generic_visit(node)

    def key(self, section, key_node, lineno, must=False):
        if isinstance(key_node, ast.Name) and key_node.id in self.loops:
            for k in self.loops[key_node.id]:
                self.keys.add(section + "." + k, self.rel)
            return
        k = const_str(key_node, self.consts)
        if k is None:
            if must:
                raise SystemExit(f"{self.rel}:{lineno}: a key this script cannot resolve to a string; teach "
                                 "scripts/deepspeed_keys.py its constant")
            return
        self.keys.add(section + "." + k, self.rel)

    def visit_Assign(self, node):
        s = self.section_of(node.value)
        for t in node.targets:
            name = dotted(t)
            if name and s is not None and name not in OUTPUT_NAMES:
                self.sections[name] = s
        self.generic_visit(node)

    def visit_Subscript(self, node):
        base = self.section_of(node.value)
        if base is not None and dotted(node.value) not in OUTPUT_NAMES:
            self.key(base, node.slice, node.lineno)
        self.generic_visit(node)

    def visit_Compare(self, node):  # KEY in d / KEY in d.keys()
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            base = self.section_of(node.comparators[0])
            if base is not None:
                self.key(base, node.left, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        fname = dotted(f) or ""
        if fname.split(".")[-1] in ("get_scalar_param", "get_dict_param", "get_list_param") and len(node.args) >= 2:
            base = self.section_of(node.args[0])
            if base is None:
                raise SystemExit(f"{self.rel}:{node.lineno}: {fname} on a dictionary this script cannot place; add it "
                                 "to READERS in scripts/deepspeed_keys.py")
            self.key(base, node.args[1], node.lineno, must=True)
        if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and node.args:
            base = self.section_of(f.value)
            if base is not None and dotted(f.value) not in OUTPUT_NAMES:
                self.key(base, node.args[0], node.lineno)
        self.generic_visit(node)


def model_classes(trees):
    """{class name: (file, ClassDef)} of DeepSpeedConfigModel subclasses (transitively)."""
    classes = {}
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (rel, node))
    models = {"DeepSpeedConfigModel"}
    changed = True
    while changed:
        changed = False
        for name, (_, node) in classes.items():
            if name not in models and any(dotted(b) in models for b in node.bases):
                models.add(name)
                changed = True
    return {n: classes[n] for n in models if n in classes}


def field_names(target, value):
    """The names a pydantic field is read under: its own and its alias."""
    names = [target]
    if isinstance(value, ast.Call) and dotted(value.func) == "Field":
        for kw in value.keywords:
            if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                names.append(kw.value.value)
    return names


def annotation_models(ann, models):
    return [n.id for n in ast.walk(ann) if isinstance(n, ast.Name) and n.id in models]


def model_fields(name, models):
    """[(field names, annotation)] of a model and its model bases."""
    rel, node = models[name]
    out = []
    for b in node.bases:
        if dotted(b) in models and dotted(b) != "DeepSpeedConfigModel":
            out += model_fields(dotted(b), models)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.append((field_names(stmt.target.id, stmt.value), stmt.annotation))
    return out


def add_model(name, section, models, keys, seen=()):
    rel = models[name][0]
    for names, ann in model_fields(name, models):
        nested = [m for m in annotation_models(ann, models) if m not in seen]
        for n in names:
            if n in ("mpu", "tp_group", "injection_policy_tuple"):  # Python objects passed in code, not JSON
                continue
            keys.add(section + "." + n, rel)
            for m in nested:
                add_model(m, section + "." + n, models, keys, seen + (name,))


def model_roots(trees, models, consts):
    """Where each model is built from the config: Model(**param_dict[KEY]) / Model(**d.get(KEY, {}))."""
    roots = []
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                sections = READERS.get((rel, node.name), READERS.get((rel, "*")))
                if sections is None:
                    continue
                walk = ReaderWalk(rel, sections, consts, Keys())
                walk.visit(node)  # learns the function's derived dictionaries
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and dotted(call.func) in models:
                        for kw in call.keywords:
                            if kw.arg is None:
                                s = walk.section_of(kw.value)
                                if s is not None:
                                    roots.append((dotted(call.func), s))
                    # DeepSpeedMonitorConfig(**{key: param_dict.get(key, {}) for key in (...)})
                    if isinstance(call, ast.Call) and dotted(call.func) in models:
                        for kw in call.keywords:
                            if kw.arg is None and isinstance(kw.value, ast.Name):
                                pass
    return roots


def constructor_keys(src, keys):
    for rel, cls, section in CONSTRUCTORS:
        tree = ast.parse(open(os.path.join(src, rel)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for f in node.body:
                    if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                        for a in f.args.args + f.args.kwonlyargs:
                            if a.arg not in NOT_KEYS:
                                keys.add(section + "." + a.arg, rel)


def deepspeed_keys(src):
    base = os.path.join(src, "deepspeed")
    trees = {rel: ast.parse(open(os.path.join(base, rel)).read()) for rel in FILES}
    consts = constants(trees)
    keys = Keys()
    # Dictionary reads.
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                sections = READERS.get((rel, node.name), READERS.get((rel, "*")))
                if sections is not None:
                    ReaderWalk(rel, sections, consts, keys).visit(node)
    models = model_classes(trees)
    roots = model_roots(trees, models, consts)
    # bf16 is read as `param_dict.get("bf16") or param_dict.get("bfloat16")` (the walk keeps the
    # latter), the monitors by a dict comprehension over their names.
    roots += [("DeepSpeedBF16Config", "bf16"), ("TensorBoardConfig", "tensorboard"), ("WandbConfig", "wandb"), ("CSVConfig", "csv_monitor"),
              ("CometConfig", "comet")]
    for model, section in roots:
        keys.add(section, models[model][0])
        add_model(model, section, models, keys)
    constructor_keys(base, keys)
    # DeepSpeed reads the pipeline section as a dictionary it merges over its defaults.
    tree = trees["runtime/config.py"]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "get_pipeline_config":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict):
                    for k in sub.keys:
                        if isinstance(k, ast.Constant):
                            keys.add("pipeline." + k.value, "runtime/config.py")
    # Sections whose keys are only those of their sub-sections are not keys themselves; a section
    # DeepSpeed reads whole (checkpoint, data_types, ...) is listed with its keys.
    parents = {k.rsplit(".", 1)[0] for k in keys.where if "." in k}
    # The keys DeepSpeed refuses itself (runtime/config.py _reject_removed_config_keys: features it removed).
    removed = set(consts.get("dict:_REMOVED_TOP_LEVEL_CONFIG_KEYS", []))
    removed |= {"zero_optimization." + k for k in consts.get("dict:_REMOVED_ZERO_CONFIG_KEYS", [])}
    return dict(keys.where), parents, removed


def shardlm_rows(shardlm):
    """{path: kind} of the key table, from `shardlm config-keys --markdown`."""
    out = subprocess.run([shardlm, "config-keys", "--markdown"], check=True, capture_output=True, text=True).stdout
    kinds = {"same": "honoured", "accepted, no effect": "notice", "feature missing: other values refused": "refused",
             "older name": "alias", "—": "shardlm"}
    rows = {}
    for line in out.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0].strip("`")] = kinds[cells[4]]
    return rows


def answer(key, rows):
    """The row that answers a key: its own, or the nearest section DeepSpeed reads as one unit."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        path = ".".join(parts[:n])
        if path in rows:
            return path
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepspeed", default="/tmp/ds/deepspeed-0.19.8", help="unpacked DeepSpeed source")
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "deepspeed", "KEYS.md"))
    args = ap.parse_args()
    version = open(os.path.join(args.deepspeed, "version.txt")).read().strip()
    where, parents, removed = deepspeed_keys(args.deepspeed)
    rows = shardlm_rows(args.shardlm)
    # A section is listed only where a row answers it as a unit or DeepSpeed reads it whole.
    listed = sorted(k for k in where if k not in parents or k in rows)
    lines = [
        f"# Every config key DeepSpeed {version} reads, and the shardlm row that answers it",
        "",
        "Written by `scripts/deepspeed_keys.py` (its docstring says how to rerun it) from DeepSpeed's source;",
        "`tests/unit/train/test_deepspeed_keys.cpp` checks every line against `src/train/keys/`.",
        "Kinds: honoured (DeepSpeed's meaning), alias (an older name, read as the key it names), notice",
        "(changes nothing shardlm computes: accepted with a one-line notice), refused (a feature shardlm",
        "lacks: accepted only with the values that turn it off, else refused naming the key and the fix).",
        "A key answered by its section's row is read by DeepSpeed as part of that section. DeepSpeed column:",
        "`reads` (accepted), or `refuses` (a feature it removed; its `_reject_removed_config_keys` stops the run).",
        "",
        "| key | DeepSpeed source | shardlm row | kind | DeepSpeed |",
        "|---|---|---|---|---|",
    ]
    missing = []
    for k in listed:
        row = answer(k, rows)
        if row is None:
            missing.append(k)
        ds = "refuses" if k in removed else "reads"
        lines.append(f"| `{k}` | deepspeed/{where[k]} | `{row or 'MISSING'}` | {rows.get(row, 'MISSING')} | {ds} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(listed)} keys, {len(missing)} without a row -> {os.path.relpath(args.out, ROOT)}")
    for k in missing:
        print("  no row:", k, "(deepspeed/" + where[k] + ")")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
