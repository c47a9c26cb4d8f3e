"""32-bit token ids through the command line: a model with Llama 3's 128256-id vocabulary trains on an
llm.c version 7 (uint32) file and on a raw_u32 file, and a 16-bit file (which cannot hold such ids) or
a file with an id past the vocabulary stops the run with a message naming the file, before anything
in out_dir is written."""
import os
import struct
import unittest

from common import ROOT, main_args, read_metrics, run, tmpdir, write_bytes, write_llmc

TINY = os.path.join(ROOT, "configs", "tiny.json")
VOCAB = 128256
# Ids spread over the whole vocabulary, most of them past 16 bits.
IDS = [(i * 7919 + 65000) % VOCAB for i in range(4000)]


def train_args(train, out_dir, *extra):
    return ["train", "--config", TINY, "--model.preset=tiny", f"--model.vocab_size={VOCAB}", "--steps=2",
            "--data.seq_len=16", "--train_micro_batch_size_per_gpu=2", "--data.val=", "--resume=false",
            f"--data.train={train}", f"--out_dir={out_dir}", *extra]


class Tokens32Bit(unittest.TestCase):
    def setUp(self):
        self.dir = tmpdir("tok32")
        self.out = os.path.join(self.dir, "run")

    def train_ok(self, *args):
        code, out, err, secs = run(list(args), timeout=300)
        self.assertEqual(code, 0, out + err)
        m = read_metrics(self.out)
        self.assertEqual([r["step"] for r in m], [1, 2])
        self.assertTrue(all(r["loss"] == r["loss"] for r in m))  # finite, not NaN
        return secs

    def expect_refused(self, args, *needles):
        code, out, err, _ = run(args, timeout=120)
        self.assertNotEqual(code, 0, out + err)
        for n in needles:
            self.assertIn(n, err, f"expected {n!r} in stderr:\n{err}")
        self.assertFalse(os.path.exists(self.out), "nothing should be written in out_dir")

    def test_trains_on_llmc_version_7(self):
        path = os.path.join(self.dir, "llama3.bin")
        write_llmc(path, IDS, bits=32)
        secs = self.train_ok(*train_args(path, self.out))
        print(f"2 steps, vocabulary {VOCAB}: {secs:.1f}s")

    def test_trains_on_raw_u32(self):
        path = os.path.join(self.dir, "raw32.bin")
        write_bytes(path, struct.pack(f"<{len(IDS)}I", *IDS))
        self.train_ok(*train_args(path, self.out, "--data.format=raw_u32"))

    def test_16_bit_file_is_refused(self):
        path = os.path.join(self.dir, "gpt2.bin")
        write_llmc(path, [i % 50257 for i in range(4000)], bits=16)  # every id fits, the width does not
        self.expect_refused(train_args(path, self.out), path, "16-bit ids", "vocab_size is 128256",
                            "Prepare 32-bit tokens")
        raw = os.path.join(self.dir, "raw16.bin")
        write_bytes(raw, struct.pack("<4000H", *range(4000)))
        self.expect_refused(train_args(raw, self.out, "--data.format=raw_u16"), raw, "16-bit ids")

    def test_id_past_the_vocabulary_is_refused_with_its_position(self):
        bad = list(IDS)
        bad[1234] = VOCAB
        path = os.path.join(self.dir, "bad.bin")
        write_llmc(path, bad, bits=32)
        self.expect_refused(train_args(path, self.out), path, "token 128256 at position 1234",
                            "vocab_size 128256")

    def test_validation_file_is_checked_too(self):
        good, bad = os.path.join(self.dir, "train.bin"), os.path.join(self.dir, "val.bin")
        write_llmc(good, IDS, bits=32)
        write_llmc(bad, list(range(100)), bits=16)
        self.expect_refused(train_args(good, self.out, f"--data.val={bad}"), bad, "16-bit ids")


if __name__ == "__main__":
    unittest.main(argv=main_args())
