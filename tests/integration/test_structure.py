"""The source tree's structure rules, checked on every CI run (CONTRIBUTING.md, "The layering rule", and
docs/architecture.md, "The layers"):
- includes between layers point down only, in the order below (no cycle, no upward arrow), and both
  documents draw that order;
- inside data/, every file sits in a sub-folder by job and includes only the sub-folders SUBLAYERS allows
  (both documents say so too);
- the trainer drives every layout and precision through the same calls: no file of src/train/ outside
  the config parsing and validation branches on pipeline parallelism or precision (the schedule and
  the precision policy decide; parallel/pipeline/schedule.h, precision/policy.h)."""
import os
import re
import unittest

from common import ROOT, main_args

SRC = os.path.join(ROOT, "src")
# Top to bottom: a layer may include the layers after it, never one before it.
LAYERS = ["cli", "train", "report", "plan", "parallel", "precision", "optim", "model", "observe", "comm", "data", "io", "util"]
# Sub-folders by job inside a layer, each with the sub-folders it may include. data/: preparation
# (`prepare`, SFT, conversations) encodes with the tokenizer and writes what the loader reads; the run-time
# loader and the tokenizer know neither each other nor preparation (a run never links a tokenizer in).
SUBLAYERS = {"data": {"prep": {"tokenizer", "loader"}, "tokenizer": set(), "loader": set()}}
# How both documents state the rule (one line each).
SUBLAYER_LINE = "data/: prep -> tokenizer, loader (tokenizer and loader include neither each other nor prep)"
# Where config keys are parsed and validated: reading bf16.enabled or pipeline_parallel is their job.
CONFIG_FILES = {"config.cpp", "config_ranges.cpp", "config_batch.cpp"}
# A condition (if / while / ternary / switch) that names a pipeline or precision setting.
BRANCH = re.compile(r"\b(if|while|switch)\s*\(|\?")
# (the namespace parallel::pp:: and text inside string literals do not count).
SETTING = re.compile(r"\bpp\b(?!::)|pipeline|\bbf16\b|\bfp16\b|float64|kHalf|kBFloat16|kDouble")
LITERAL = re.compile(r'"(\\.|[^"\\])*"')


def drawn_layers(text):
    """The layers of a document's diagram line `cli -> train -> ... -> util`, or None without one."""
    m = re.search(r"^(cli(?: -> [a-z]+)+)$", text, re.M)
    return m.group(1).split(" -> ") if m else None


def sublayer_problem(layer, sub, include):
    """Why `#include "<include>"` in src/<layer>/<sub>/ breaks SUBLAYERS, or None."""
    parts = include.split("/")
    if parts[0] not in SUBLAYERS:
        return None
    allowed = SUBLAYERS[parts[0]]
    if len(parts) < 3 or parts[1] not in allowed:
        return f"includes {include}, outside {parts[0]}/'s sub-folders {sorted(allowed)}"
    if layer == parts[0] and parts[1] != sub and parts[1] not in allowed[sub]:
        return f"{layer}/{sub} includes {layer}/{parts[1]}"
    return None


def sources(folder):
    for d, _, files in os.walk(folder):
        for f in sorted(files):
            if f.endswith((".h", ".cpp")):
                yield os.path.join(d, f)


class Structure(unittest.TestCase):
    def test_layers_include_downward_only(self):
        present = sorted(d for d in os.listdir(SRC) if os.path.isdir(os.path.join(SRC, d)))
        self.assertEqual(sorted(LAYERS), present, "a layer was added or removed: place it in LAYERS, CONTRIBUTING.md "
                                                  "and docs/architecture.md")
        upward = []
        for layer in LAYERS:
            for path in sources(os.path.join(SRC, layer)):
                with open(path) as f:
                    for n, line in enumerate(f, 1):
                        m = re.match(r'\s*#include "([a-z_]+)/', line)
                        if m and m.group(1) not in LAYERS:
                            upward.append(f"{os.path.relpath(path, ROOT)}:{n}: includes {m.group(1)}/, not a layer")
                        elif m and m.group(1) != layer and LAYERS.index(m.group(1)) < LAYERS.index(layer):
                            upward.append(f"{os.path.relpath(path, ROOT)}:{n}: {layer} includes {m.group(1)}")
        self.assertEqual(upward, [], "includes must point down the layer order")

    def test_sublayers_by_job(self):
        wrong = []
        for layer, subs in SUBLAYERS.items():
            top = os.path.join(SRC, layer)
            present = sorted(d for d in os.listdir(top) if os.path.isdir(os.path.join(top, d)))
            self.assertEqual(sorted(subs), present, f"src/{layer}/'s sub-folders changed: update SUBLAYERS and the docs")
            loose = [f for f in os.listdir(top) if os.path.isfile(os.path.join(top, f))]
            self.assertEqual(loose, [], f"every file of src/{layer}/ belongs in one of {sorted(subs)}")
        for path in sources(SRC):
            rel = os.path.relpath(path, SRC).split(os.sep)
            layer, sub = rel[0], rel[1] if len(rel) > 2 else ""
            if layer in SUBLAYERS and sub not in SUBLAYERS[layer]:
                continue  # reported above
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#include "([a-z_]+/[^"]+)"', line)
                    why = m and sublayer_problem(layer, sub, m.group(1))
                    if why:
                        wrong.append(f"{os.path.relpath(path, ROOT)}:{n}: {why}")
        self.assertEqual(wrong, [], "includes between sub-folders must follow SUBLAYERS")
        for doc in ("CONTRIBUTING.md", os.path.join("docs", "architecture.md")):
            with open(os.path.join(ROOT, doc)) as f:
                self.assertIn(SUBLAYER_LINE, f.read(), f"{doc} does not state data/'s sub-folder rule")

    def test_the_docs_draw_the_layer_order(self):
        for doc in ("CONTRIBUTING.md", os.path.join("docs", "architecture.md")):
            with open(os.path.join(ROOT, doc)) as f:
                self.assertEqual(drawn_layers(f.read()), LAYERS, f"{doc}'s layer diagram is not LAYERS' order")
        self.assertNotEqual(drawn_layers("```\ncli -> plan -> train\n```"), LAYERS)
        self.assertIsNone(drawn_layers("no diagram"))

    def test_no_pipeline_or_precision_branch_in_train(self):
        found = []
        for path in sources(os.path.join(SRC, "train")):
            if os.path.basename(path) in CONFIG_FILES:
                continue
            with open(path) as f:
                lines = f.read().split("\n")
            n = 0
            while n < len(lines):
                # A statement continued over lines (an unclosed parenthesis) is read as one.
                start, code = n, LITERAL.sub('""', lines[n].split("//")[0])
                while code.count("(") > code.count(")") and n + 1 < len(lines):
                    n += 1
                    code += " " + LITERAL.sub('""', lines[n].split("//")[0])
                if BRANCH.search(code) and SETTING.search(code):
                    found.append(f"{os.path.relpath(path, ROOT)}:{start + 1}: {code.strip()}")
                n += 1
        self.assertEqual(found, [], "src/train holds a branch on pipeline parallelism or precision")

    def test_the_checks_can_fail(self):
        # The patterns catch what they are meant to (a check that cannot fail checks nothing).
        self.assertTrue(BRANCH.search("if (s.pipeline)") and SETTING.search("if (s.pipeline)"))
        self.assertTrue(BRANCH.search("x = cfg.bf16 ? a : b") and SETTING.search("x = cfg.bf16 ? a : b"))
        self.assertFalse(SETTING.search("if (s.val_loader)"))
        self.assertFalse(SETTING.search(LITERAL.sub('""', 'if (x) log("pp=" + parallel::pp::name)')))
        self.assertIsNone(sublayer_problem("data", "prep", "data/tokenizer/tokenizer.h"))
        self.assertIsNone(sublayer_problem("train", "", "data/loader/prefetch.h"))
        self.assertIn("data/loader includes data/tokenizer", sublayer_problem("data", "loader", "data/tokenizer/tokenizer.h"))
        self.assertIn("data/tokenizer includes data/prep", sublayer_problem("data", "tokenizer", "data/prep/sft.h"))
        self.assertIn("outside data/", sublayer_problem("cli", "", "data/tokenizer.h"))
        # ... and a condition continued on the next line (see the joining above).
        code = "if (a &&" + " " + "cfg.bf16)"
        self.assertTrue(BRANCH.search(code) and SETTING.search(code))


if __name__ == "__main__":
    unittest.main(argv=main_args())
