"""The README and the pages of docs/ name only paths that exist: every `src/...`, `tests/...`, `bench/...`,
`scripts/...`, `configs/...`, `data/...` and `docs/...` they quote is in the tree (a file, a directory, or a
C++ stem whose .h/.cpp exists), and every script they run directly is executable in git. The README stays a
front page (at most 250 lines) whose links into docs/ resolve, every docs page is reachable (linked from the
README or from another page) and every relative link of a page resolves. The training config key table of
docs/configuration.md is exactly what `shardlm config-keys --markdown` prints from the key table
(src/train/keys/, one file per
section)."""
import glob
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args, run  # noqa: E402

README_MAX_LINES = 250
KEY_TABLE_PAGE = os.path.join("docs", "configuration.md")


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def readme():
    return read("README.md")


def doc_pages():
    """The docs/ pages, as paths relative to the repository root."""
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def all_docs():
    """{path: text} of the README and every docs page."""
    return {rel: read(rel) for rel in ["README.md"] + doc_pages()}


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchored_links(page, text):
    """(file, anchor) of every relative Markdown link of a page (external links left out): the file as a
    path relative to the repository root (the page itself for an in-page anchor), the anchor or ""."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append((os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page, anchor))
    return out


def relative_links(page, text):
    """The files a page's Markdown links point to, as paths relative to the repository root."""
    return [path for path, _ in anchored_links(page, text)]


def anchors(text):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(pages):
    """'page -> target' for every relative link of `pages` ({path: text}) whose file does not exist, or
    whose #anchor names no heading of a Markdown file."""
    broken = []
    for page, text in sorted(pages.items()):
        for path, anchor in anchored_links(page, text):
            full = os.path.join(ROOT, path)
            if not os.path.exists(full) and path not in pages:
                broken.append(f"{page} -> {path}")
            elif anchor and path.endswith(".md"):
                target = pages[path] if path in pages else open(full).read()
                if anchor not in anchors(target):
                    broken.append(f"{page} -> {path}#{anchor}")
    return broken


def unlinked_pages(pages):
    """The docs pages of `pages` ({path: text}) that neither the README nor another page links to."""
    linked = set()
    for page, text in pages.items():
        linked.update(t for t in relative_links(page, text) if t != page)
    return sorted(p for p in pages if p.startswith("docs" + os.sep) and p not in linked)


class Docs(unittest.TestCase):
    def test_every_quoted_path_exists(self):
        quoted = re.compile(r"`((?:src|tests|bench|scripts|configs|data|docs)/[A-Za-z0-9_./-]+)`")
        # CONTRIBUTING.md's worked examples name the files one touches: they must exist too.
        texts = list(all_docs().values()) + [read("CONTRIBUTING.md")]
        paths = sorted({p for text in texts for p in quoted.findall(text)})
        self.assertGreater(len(paths), 20)
        missing = [p for p in paths if not any(os.path.exists(os.path.join(ROOT, p + ext)) for ext in ("", ".h", ".cpp"))]
        self.assertEqual(missing, [], "README.md, CONTRIBUTING.md or docs/ name paths that do not exist")

    def test_scripts_they_run_are_executable_in_git(self):
        scripts = sorted({s for text in all_docs().values() for s in re.findall(r"scripts/[A-Za-z0-9_/.-]+\.sh", text)})
        self.assertIn("scripts/demo.sh", scripts)
        for s in scripts:
            mode = subprocess.run(["git", "ls-files", "-s", s], cwd=ROOT, capture_output=True, text=True).stdout[:6]
            if mode:  # a git checkout (CI's fresh clone is one)
                self.assertEqual(mode, "100755", f"{s} is run directly by the docs but not executable in git")

    def test_readme_is_a_front_page(self):
        text = readme()
        lines = text.count("\n")
        self.assertLessEqual(lines, README_MAX_LINES, "README.md grew past a front page: move the details to docs/")
        first = text.index("bash scripts/demo.sh")
        self.assertLess(first, text.index("bash scripts/test.sh"), "the README starts with the demo, then the tests")
        self.assertLess(text.count("\n", 0, first), 25, "the two commands come first")

    def test_readme_links_into_docs_resolve(self):
        targets = [t for t in relative_links("README.md", readme()) if t.startswith("docs" + os.sep)]
        self.assertGreater(len(targets), 15, "the README's feature table links the docs pages")
        self.assertEqual(broken_links({"README.md": readme()}), [])

    def test_every_page_is_linked_and_its_links_resolve(self):
        pages = all_docs()
        self.assertGreater(len(pages), 15)
        self.assertEqual(unlinked_pages(pages), [], "a docs page no other page links to: link it from the README's "
                                                    "feature table or from the page of its topic")
        self.assertEqual(broken_links(pages), [])

    def test_the_link_checks_fail_on_a_broken_tree(self):
        page, orphan = os.path.join("docs", "planner.md"), os.path.join("docs", "orphan.md")
        pages = {"README.md": "[planner](docs/planner.md#time-model-and-plan---search) [gone](docs/no-such-page.md)",
                 page: "# Planner\n## Time model and `plan --search`\n[self](#planner) [moved](#time-model) "
                       "[up](../README.md) [web](https://example.com)",
                 orphan: "[planner](planner.md)"}
        self.assertEqual(broken_links(pages), [f"README.md -> {os.path.join('docs', 'no-such-page.md')}",
                                               f"{page} -> {page}#time-model"])
        self.assertEqual(unlinked_pages(pages), [orphan])


BEGIN, END = "<!-- config-keys:begin -->\n", "<!-- config-keys:end -->"


def key_table(text):
    """The text between the page's config-keys markers (exactly one pair, in order)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{KEY_TABLE_PAGE} must hold one <!-- config-keys:begin --> ... <!-- config-keys:end --> pair")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def table_differs(page_text, printed):
    """None when the page's key table is `printed`, else the first line that differs."""
    ours, theirs = key_table(page_text).split("\n"), printed.split("\n")
    for n, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"line {n + 1} of the table:\n  {KEY_TABLE_PAGE}:  {a}\n  printed: {b}"
    return None if len(ours) == len(theirs) else f"the page's table has {len(ours)} lines, the printed {len(theirs)}"


class ConfigKeyTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        code, out, err, _ = run(["config-keys", "--markdown"], timeout=60)
        assert code == 0, out + err
        cls.printed = out

    def test_docs_table_is_the_printed_table(self):
        self.assertGreater(self.printed.count("\n| `"), 80, "one row per key")
        diff = table_differs(read(KEY_TABLE_PAGE), self.printed)
        self.assertIsNone(diff, f"{KEY_TABLE_PAGE}'s config key table is not `shardlm config-keys --markdown`; paste "
                                "that output between the config-keys markers\n" + str(diff))

    def test_the_readme_holds_no_second_table(self):
        self.assertFalse(BEGIN in readme(), f"README.md holds a config-keys table: it lives in {KEY_TABLE_PAGE} only")

    def test_the_comparison_fails_on_a_changed_table(self):
        text = read(KEY_TABLE_PAGE)
        row = next(line for line in key_table(text).split("\n") if line.startswith("| `steps` |"))
        for mutated in (text.replace(row, row.replace("`100`", "`101`")),  # a default
                        text.replace(row + "\n", ""),                       # a row dropped
                        text.replace(row, row + "\n| `stepz` | integer | `1` |  | — | typo |"),  # a row added
                        text.replace(END, "trailing text\n" + END)):
            self.assertIsNotNone(table_differs(mutated, self.printed))
        with self.assertRaises(ValueError):
            key_table(text.replace(END, ""))


if __name__ == "__main__":
    unittest.main(argv=main_args(), verbosity=2)
