"""`shardlm prepare --sft` on conversations (issue 41, docs/chat-templates.md): messages and ShareGPT lines
rendered with a real chat template give the ids and masks that make_chat_cases.py computed with the pinned
transformers (fixture reference_chat_cases: the build tree's chat_cases/), packed and padded rows, the same
files for any --threads, the turns the prefix rule leaves out reported, --train-on last, and bad lines
(not JSON, no messages, unknown role, no assistant turn, the template's raise_exception) named by file and
line with the output folder untouched, or skipped and counted."""
import json
import os
import sys
import unittest

from common import main_args, run, tmpdir, SHARDLM

CASES = os.path.join(os.path.dirname(SHARDLM), "chat_cases")


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, count = int.from_bytes(raw[0:4], "little"), int.from_bytes(raw[8:12], "little")
    width = {20240520: 2, 20240801: 4}[magic]
    body = raw[1024:]
    assert len(body) == width * count
    return [int.from_bytes(body[i:i + width], "little") for i in range(0, len(body), width)]


def read_mask(path):
    with open(path, "rb") as f:
        raw = f.read()
    return int.from_bytes(raw[16:20], "little"), list(raw[32:])


def samples(out_dir, split="train"):
    """The (ids, counts) of each sample of a split, read from its rows (padding dropped)."""
    ids = read_tokens(os.path.join(out_dir, f"{split}.bin"))
    row, bits = read_mask(os.path.join(out_dir, f"{split}.bin.mask"))
    out = []
    for r in range(0, len(ids), row):
        starts = [i for i in range(r, r + row) if bits[i] & 2]
        ends = starts[1:] + [r + row]
        for b, e in zip(starts, ends):
            out.append((ids[b:e], [x & 1 for x in bits[b:e]]))
    return out


def goldens(template):
    with open(os.path.join(CASES, "conversations.jsonl"), encoding="utf-8") as f:
        convs = [json.loads(line) for line in f]
    with open(os.path.join(CASES, template, "cases.jsonl"), encoding="utf-8") as f:
        cases = [json.loads(line) for line in f]
    return convs, cases


def prepare(*args):
    return run(["prepare", "--sft", "--template-date", "2025-03-14", *args], timeout=300)


class PrepareChat(unittest.TestCase):
    def write(self, d, name, lines):
        path = os.path.join(d, name)
        with open(path, "w", encoding="utf-8") as f:
            for line in lines:
                f.write((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n")
        return path

    def kept_cases(self, template):
        """The conversations transformers renders and masks with `template`, and their goldens."""
        convs, cases = goldens(template)
        return [(convs[c["conversation"]], c) for c in cases if "mask" in c]

    def trim(self, ids, counts, golden_ids, golden_mask):
        # The row's padding follows a sample (it never counts); a sample's first token is no target of
        # it (sft.h), whatever the mask says.
        n = len(golden_ids)
        self.assertEqual(ids[:n], golden_ids)
        self.assertEqual(counts[1:n], golden_mask[1:])
        self.assertEqual(sum(counts[n:]), 0)

    def test_ids_and_masks_equal_transformers_for_any_threads(self):
        if not os.path.isdir(CASES):
            self.fail(f"no chat cases in {CASES}: ctest makes them first (fixture reference_chat_cases)")
        # The last: a real SentencePiece-style (Metaspace) tokenizer.json with its own template.
        for template in ("Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                         "mistralai-Mistral-7B-Instruct-v0.3"):
            kept = self.kept_cases(template)
            d = tmpdir("prep_chat")
            data = self.write(d, "chat.jsonl", [conv for conv, _ in kept])
            outs = []
            for threads, layout in (("1", "--pack"), ("2", "--pack"), ("2", "--pad")):
                out = os.path.join(d, f"out_{threads}{layout}")
                code, stdout, err, _ = prepare("--input", data, "--tokenizer", os.path.join(CASES, template),
                                               "--out-dir", out, "--seq-len", "1024", layout, "--val-fraction", "0",
                                               "--threads", threads)
                self.assertEqual(code, 0, stdout + err)
                left_out = sum(c["left_out"] for _, c in kept)
                self.assertIn(f"{left_out} left out of the loss", stdout)
                got = samples(out)
                self.assertEqual(len(got), len(kept))
                for (ids, counts), (_, c) in zip(got, kept):
                    self.trim(ids, counts, c["ids"], c["mask"])
                outs.append(out)
            with open(os.path.join(outs[0], "train.bin"), "rb") as a, open(os.path.join(outs[1], "train.bin"), "rb") as b:
                self.assertEqual(a.read(), b.read(), "--threads changed the output")

    def test_train_on_last_and_sharegpt(self):
        template = "Qwen-Qwen2.5-7B-Instruct"
        kept = self.kept_cases(template)
        d = tmpdir("prep_chat_last")
        lines = []
        for conv, _ in kept:  # as ShareGPT
            speakers = {"user": "human", "assistant": "gpt", "system": "system", "tool": "tool"}
            turns = []
            for m in conv["messages"]:
                t = {"from": speakers[m["role"]], **{k: v for k, v in m.items() if k not in ("role", "content")}}
                if "content" in m:
                    t["value"] = m["content"]
                turns.append(t)
            lines.append({"conversations": turns, **{k: v for k, v in conv.items() if k != "messages"}})
        data = self.write(d, "sharegpt.jsonl", lines)
        out = os.path.join(d, "out")
        code, stdout, err, _ = prepare("--input", data, "--tokenizer", os.path.join(CASES, template), "--out-dir", out,
                                       "--seq-len", "512", "--val-fraction", "0", "--train-on", "last", "--threads", "2")
        self.assertEqual(code, 0, stdout + err)
        for (ids, counts), (_, c) in zip(samples(out), kept):
            self.trim(ids, counts, c["ids"], c["mask_last"])

    def test_bad_lines_are_named_and_nothing_is_written_or_skipped_and_counted(self):
        template = "google-gemma-2-2b-it"  # raises "System role not supported"
        d = tmpdir("prep_chat_bad")
        good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        bad = [
            ("{not json", "is not valid JSON"),
            ({"prompt": "p", "completion": "c"}, "no \"messages\""),
            ({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}, "unknown role \"robot\""),
            ({"messages": [{"role": "user", "content": "only a question"}]}, "no assistant turn"),
            ({"messages": [{"role": "system", "content": "s"}, *good["messages"]]}, "System role not supported"),
        ]
        for k, (line, why) in enumerate(bad):
            data = self.write(d, f"bad{k}.jsonl", [good, good, line, good])
            out = os.path.join(d, f"out{k}")
            os.makedirs(out)
            with open(os.path.join(out, "keep.txt"), "w") as f:
                f.write("untouched")
            code, stdout, err, _ = prepare("--input", data, "--tokenizer", os.path.join(CASES, template),
                                           "--out-dir", out, "--seq-len", "64", "--val-fraction", "0")
            self.assertNotEqual(code, 0, stdout)
            self.assertIn(f"{data} line 3", err)
            self.assertIn(why, err)
            self.assertEqual(sorted(os.listdir(out)), ["keep.txt"])
            code, stdout, err, _ = prepare("--input", data, "--tokenizer", os.path.join(CASES, template),
                                           "--out-dir", out, "--seq-len", "64", "--val-fraction", "0",
                                           "--skip-bad-lines")
            self.assertEqual(code, 0, stdout + err)
            self.assertIn("skipped 1 bad lines", stdout)
            self.assertEqual(len(samples(out)), 3)

    def test_chat_flags_need_conversations(self):
        d = tmpdir("prep_chat_flags")
        data = self.write(d, "pairs.jsonl", [{"prompt": "p", "completion": "c"}])
        code, stdout, err, _ = prepare("--input", data, "--tokenizer", os.path.join(CASES, "Qwen-Qwen2.5-7B-Instruct"),
                                       "--out-dir", os.path.join(d, "o"), "--seq-len", "64", "--train-on", "last")
        self.assertNotEqual(code, 0)
        self.assertIn("describe conversations", err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
