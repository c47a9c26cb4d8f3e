"""The README names only paths that exist: every `src/...`, `tests/...`, `bench/...`, `scripts/...`,
`configs/...` and `data/...` it quotes is in the tree (a file, a directory, or a C++ stem whose .h/.cpp
exists), and every script it runs directly is executable in git."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, main_args  # noqa: E402


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


if __name__ == "__main__":
    unittest.main(argv=main_args(), verbosity=2)
