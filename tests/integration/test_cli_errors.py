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

    # --- types, ranges and clear failures (issue 11) ---

    # Each case costs a process start (seconds here); the unit tests in tests/unit/train cover the rest.
    def test_fractional_integers_are_refused_not_truncated(self):
        self.expect_error(["train", "--config", TINY, "--data.seq_len=32.7"], "data.seq_len: must be an integer, got 32.7")

    def test_out_of_range_values_are_named(self):
        for arg, words in (("--optimizer.params.betas=[0.9, 1.5]", "[0, 1)"),
                           ("--data.eval_batches=0", "data.eval_batches must be >= 1")):  # it logged val_loss -nan
            self.expect_error(["train", "--config", TINY, arg], words)

    def test_top_level_json_array_is_a_clear_error(self):
        d = tmpdir("array")
        path = os.path.join(d, "c.json")
        write_bytes(path, b"[1, 2]")
        err = self.expect_error(["train", "--config", path, "--steps=3"], "must be a JSON object")
        self.assertNotIn("internal error", err)

    def test_unwritable_out_dir_stops_before_training(self):
        d = tmpdir("ro")
        blocker = os.path.join(d, "file")
        write_bytes(blocker, b"x")
        self.expect_error(["train", "--config", TINY, f"--out_dir={blocker}/run"], "out_dir", "is a file")
        ro = os.path.join(d, "readonly")
        os.makedirs(ro)
        os.chmod(ro, 0o555)
        if os.access(ro, os.W_OK):  # root ignores permission bits: use a read-only system directory
            ro = "/proc/sys"
            if os.access(ro, os.W_OK):
                self.skipTest("no read-only directory available here")
        err = self.expect_error(["train", "--config", TINY, f"--out_dir={ro}/run"], "is not writable", "choose a writable out_dir")
        self.assertNotIn("internal error", err)

    def test_out_of_memory_is_an_error_with_advice_not_a_backtrace(self):
        tmp = tmpdir("oom")
        d = os.path.join(tmp, "run")
        # A vocabulary this large needs 32-bit token files (a 16-bit one is refused at load).
        tokens = os.path.join(tmp, "tokens32.bin")
        write_llmc(tokens, [i % 4096 for i in range(5000)], bits=32)
        # device_memory far above the plan: past the memory guard (tests/integration/test_guard.py), so
        # the allocation itself fails.
        err = self.expect_error(["train", "--config", TINY, "--steps=1", "--model.vocab_size=100000000000",
                                 f"--data.train={tokens}", "--data.val=", "--device_memory=1000TB", f"--out_dir={d}"],
                                "out of memory", "shardlm plan")
        self.assertNotIn("internal error", err)
        self.assertNotIn("frame #", err)

    def write_golden_with(self, d, config_text=None, nan_tensor=None):
        golden = os.path.join(ROOT, "tests", "golden", "tiny")
        cfg = read_bytes(os.path.join(golden, "config.json")) if config_text is None else config_text
        write_bytes(os.path.join(d, "config.json"), cfg)
        data = bytearray(read_bytes(os.path.join(golden, "model.safetensors")))
        if nan_tensor:
            import json
            n = struct.unpack("<Q", bytes(data[:8]))[0]
            info = json.loads(bytes(data[8:8 + n]))[nan_tensor]
            self.assertEqual(info["dtype"], "F32")
            at = 8 + n + info["data_offsets"][0]
            data[at:at + 4] = struct.pack("<f", float("nan"))
        write_bytes(os.path.join(d, "model.safetensors"), bytes(data))

    def test_nan_init_weights_are_named(self):
        d = tmpdir("naninit")
        self.write_golden_with(d, nan_tensor="model.norm.weight")
        self.expect_error(["train", "--config", TINY, f"--init={d}", "--model={}", "--data.val=", self.small_vocab_data(d)],
                          "NaN or inf", "model.norm.weight")

    def test_hf_config_without_the_shape_is_refused_for_init_and_generate(self):
        # An empty config.json used to become Llama-7B's shape silently.
        d = tmpdir("hfcfg")
        self.write_golden_with(d, config_text=b"{}")
        self.expect_error(["train", "--config", TINY, f"--init={d}", "--model={}", "--data.val=", self.small_vocab_data(d)],
                          "lacks vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads")
        self.write_golden_with(d, config_text=b'{"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2}')
        self.expect_error(["generate", "--model", d, "--prompt", "The",
                           "--tokenizer", os.path.join(ROOT, "data", "brown", "tokenizer.model")],
                          "lacks intermediate_size, num_attention_heads")

if __name__ == "__main__":
    unittest.main(argv=main_args())
