"""`train --hostfile` (util/hostfile.h): a DeepSpeed/OpenMPI hostfile with localhost entries launches
that many ranks through mpirun; --include/--exclude select slots; bad files are refused before any
rank starts."""
import glob
import os
import unittest

from common import ROOT, main_args, run, tmpdir

CONFIG = os.path.join(ROOT, "configs", "tiny.json")


class Hostfile(unittest.TestCase):
    def hostfile(self, text):
        d = tmpdir("hostfile")
        path = os.path.join(d, "hosts")
        with open(path, "w") as f:
            f.write(text)
        return path

    def train(self, *args):
        out = tmpdir("hostfile_run")
        return run(["train", "--config", CONFIG, "--steps=2", "--data.val=", f"--out_dir={out}", *args], timeout=300)

    def test_localhost_slots_start_that_many_ranks(self):
        before = set(glob.glob("/tmp/shardlm-hostfile-*"))
        code, out, err, _ = self.train("--hostfile", self.hostfile("# DeepSpeed's format\nlocalhost slots=2\n"))
        self.assertEqual(code, 0, out + err)
        self.assertIn("2 rank(s) (dp=2", out)
        self.assertEqual(set(glob.glob("/tmp/shardlm-hostfile-*")), before, "the launch hostfile is removed")

    def test_include_and_exclude_pick_slots(self):
        hosts = self.hostfile("localhost slots=2 max_slots=2\n")
        for flag, spec in (("--include", "localhost:1"), ("--exclude", "localhost:0")):
            code, out, err, _ = self.train("--hostfile", hosts, flag, spec)
            self.assertEqual(code, 0, out + err)
            self.assertIn("1 rank(s) (dp=1", out)
        code, out, err, _ = self.train("--hostfile", hosts, "--nproc", "1")
        self.assertEqual(code, 0, out + err)
        self.assertIn("1 rank(s) (dp=1", out)

    def test_bad_hostfiles_are_refused_before_launch(self):
        for text, flags, message in (
                ("localhost\n", (), "host localhost has no slots=N"),
                ("localhost slots=2 gpus=2\n", (), "unknown entry 'gpus=2'"),
                ("localhost slots=2\n", ("--include", "node-9"), "names host 'node-9'"),
                ("localhost slots=2\n", ("--nproc", "3"), "--nproc 3 but the hostfile has 2 slot(s)"),
                ("localhost slots=2\n", ("--include", "localhost", "--exclude", "localhost:0"), "cannot be combined")):
            code, out, err, _ = self.train("--hostfile", self.hostfile(text), *flags)
            self.assertNotEqual(code, 0, text)
            self.assertIn(message, err)
            self.assertNotIn("mpirun", err)
        code, out, err, _ = self.train("--include", "localhost")
        self.assertNotEqual(code, 0)
        self.assertIn("--include/--exclude need --hostfile FILE", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
