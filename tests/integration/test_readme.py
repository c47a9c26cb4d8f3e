"""The README names only paths that exist: every `src/...`, `tests/...`, `bench/...`, `scripts/...`,
`configs/...` and `data/...` it quotes is in the tree (a file, a directory, or a C++ stem whose .h/.cpp
exists), and every script it runs directly is executable in git. Its training config key table is
exactly what `shardlm config-keys --markdown` prints from the key table (src/train/keys/, one file per section)."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args, run  # noqa: E402


def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


class Readme(unittest.TestCase):
    def test_every_quoted_path_exists(self):
        paths = sorted(set(re.findall(r"`((?:src|tests|bench|scripts|configs|data)/[A-Za-z0-9_./-]+)`", readme())))
        self.assertGreater(len(paths), 20)
        missing = [p for p in paths if not any(os.path.exists(os.path.join(ROOT, p + ext)) for ext in ("", ".h", ".cpp"))]
        self.assertEqual(missing, [], "README names paths that do not exist")

    def test_scripts_it_runs_are_executable_in_git(self):
        scripts = sorted(set(re.findall(r"scripts/[A-Za-z0-9_/.-]+\.sh", readme())))
        self.assertTrue(scripts)
        for s in scripts:
            mode = subprocess.run(["git", "ls-files", "-s", s], cwd=ROOT, capture_output=True, text=True).stdout[:6]
            if mode:  # a git checkout (CI's fresh clone is one)
                self.assertEqual(mode, "100755", f"{s} is run directly by the README but not executable in git")


BEGIN, END = "<!-- config-keys:begin -->\n", "<!-- config-keys:end -->"


def key_table(text):
    """The text between the README's config-keys markers (exactly one pair, in order)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError("the README must hold one <!-- config-keys:begin --> ... <!-- config-keys:end --> pair")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def table_differs(readme_text, printed):
    """None when the README's key table is `printed`, else the first line that differs."""
    ours, theirs = key_table(readme_text).split("\n"), printed.split("\n")
    for n, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"line {n + 1} of the table:\n  README:  {a}\n  printed: {b}"
    return None if len(ours) == len(theirs) else f"the README's table has {len(ours)} lines, the printed {len(theirs)}"


class ConfigKeyTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        code, out, err, _ = run(["config-keys", "--markdown"], timeout=60)
        assert code == 0, out + err
        cls.printed = out

    def test_readme_table_is_the_printed_table(self):
        self.assertGreater(self.printed.count("\n| `"), 80, "one row per key")
        diff = table_differs(readme(), self.printed)
        self.assertIsNone(diff, "README's config key table is not `shardlm config-keys --markdown`; paste that "
                                "output between the config-keys markers\n" + str(diff))

    def test_the_comparison_fails_on_a_changed_table(self):
        text = readme()
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
