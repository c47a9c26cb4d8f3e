"""Bad input gets a clear message naming the problem and the fix, a non-zero exit, and nothing lost."""
import os
import struct
import unittest

from common import ROOT, main_args, read_bytes, run, tmpdir, write_bytes, write_llmc

TINY = os.path.join(ROOT, "configs", "tiny.json")


class CliErrors(unittest.TestCase):
    def expect_error(self, args, *needles):
        code, out, err, _ = run(args, timeout=120)
        self.assertNotEqual(code, 0, out + err)
        for n in needles:
            self.assertIn(n, err, f"expected {n!r} in stderr:\n{err}")
        return err

    def test_unknown_config_key_lists_valid_keys(self):
        self.expect_error(["train", "--config", TINY, "--gradient_acumulation_steps=2"],
                          "unknown config key 'gradient_acumulation_steps'", "gradient_accumulation_steps")

    def test_unknown_nested_key(self):
        self.expect_error(["train", "--config", TINY, "--optimizer.params.learning_rate=1"],
                          "optimizer.params.learning_rate", "Valid keys in optimizer.params: lr")

    def test_inconsistent_batch_sizes_show_arithmetic(self):
        self.expect_error(["train", "--config", TINY, "--nproc", "2", "--train_batch_size=24"],
                          "train_batch_size = 24", "4 x 1 x 2 = 8")

    def test_truncated_token_file_and_nothing_lost(self):
        d = tmpdir("trunc")
        src = read_bytes(os.path.join(ROOT, "data", "brown", "val.bin"))
        bad = os.path.join(d, "bad.bin")
        write_bytes(bad, src[: len(src) // 2])
        out_dir = os.path.join(d, "run")
        os.makedirs(out_dir)
        keep = os.path.join(out_dir, "metrics.jsonl")
        write_bytes(keep, b'{"step": 1}\n')
        self.expect_error(["train", "--config", TINY, f"--data.train={bad}", f"--out_dir={out_dir}"],
                          bad, "truncated")
        self.assertEqual(read_bytes(keep), b'{"step": 1}\n', "an earlier run's metrics were overwritten")

    def test_wrong_magic_token_file_suggests_raw_format(self):
        d = tmpdir("magic")
        bad = os.path.join(d, "raw.bin")
        write_bytes(bad, struct.pack("<4096H", *range(4096)))
        self.expect_error(["train", "--config", TINY, f"--data.train={bad}"], "magic", "raw_u16")

    def test_token_ids_beyond_vocab(self):
        self.expect_error(["train", "--config", TINY, "--model.vocab_size=1000"], "vocab_size 1000")

    def test_missing_data_file(self):
        self.expect_error(["train", "--config", TINY, "--data.train=/nonexistent/train.bin"],
                          "/nonexistent/train.bin")

    def small_vocab_data(self, d):
        path = os.path.join(d, "tokens.bin")
        write_llmc(path, [i % 128 for i in range(5000)])
        return f"--data.train={path}"

    def test_corrupt_safetensors_init_is_refused_naming_the_tensor(self):
        d = tmpdir("init")
        golden = os.path.join(ROOT, "tests", "golden", "tiny")
        data = read_bytes(os.path.join(golden, "model.safetensors"))
        write_bytes(os.path.join(d, "config.json"), read_bytes(os.path.join(golden, "config.json")))
        write_bytes(os.path.join(d, "model.safetensors"), data[:-1000])  # truncated
        err = self.expect_error(["train", "--config", TINY, f"--init={d}", "--model={}", "--data.val=", self.small_vocab_data(d)],
                                "truncated")
        self.assertIn("lm_head.weight", err)

    def test_bad_header_safetensors(self):
        d = tmpdir("hdr")
        golden = os.path.join(ROOT, "tests", "golden", "tiny")
        write_bytes(os.path.join(d, "config.json"), read_bytes(os.path.join(golden, "config.json")))
        header = b"{not json at all, really not json!!!!!}"
        write_bytes(os.path.join(d, "model.safetensors"), struct.pack("<Q", len(header)) + header)
        self.expect_error(["train", "--config", TINY, f"--init={d}", "--model={}", "--data.val=", self.small_vocab_data(d)],
                          "model.safetensors", "JSON")

    def test_device_cuda_without_a_gpu_stops_at_once(self):
        # This suite runs on machines without a GPU (CI); on a GPU machine the run would start.
        if os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1"):
            self.skipTest("a GPU may be visible here")
        d = os.path.join(tmpdir("cuda"), "run")
        for args in (["--device", "cuda"], ["--device=cuda", "--nproc", "2"], ["--device=cuda", "--comm.backend=mpi"]):
            code, out, err, secs = run(["train", "--config", TINY, f"--out_dir={d}", *args], timeout=120)
            self.assertNotEqual(code, 0, out + err)
            self.assertIn("no CUDA GPU is visible", err)
            self.assertIn("--device cpu", err)
            self.assertEqual(err.count("no CUDA GPU is visible"), 1, "reported once, before ranks start")
            self.assertLess(secs, 30, "must stop at once, not after loading data or starting ranks")
            self.assertFalse(os.path.exists(d), "nothing should be written")

    def test_nccl_on_the_cpu_is_refused(self):
        self.expect_error(["train", "--config", TINY, "--comm.backend=nccl"], "comm.backend=nccl needs device=cuda")

    def test_unknown_command_and_missing_config(self):
        code, _, err, _ = run(["trian"])
        self.assertNotEqual(code, 0)
        self.assertIn("unknown command 'trian'", err)
        self.expect_error(["train"], "--config FILE is required")


if __name__ == "__main__":
    unittest.main(argv=main_args())
