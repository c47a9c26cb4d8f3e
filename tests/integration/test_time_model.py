"""`shardlm bench machine` writes a machine profile that `shardlm plan --machine` prices layouts with,
and `plan --search` lists the layouts that fit, fastest predicted first, and emits the first as a
config that trains (issue 26). The predictions' accuracy is measured by bench/time_model.py, not
asserted here: timings on a shared 2-core machine are not a test."""
import json
import os
import unittest

from common import ROOT, main_args, read_bytes, read_metrics, run, tmpdir

TINY = ["--model", "tiny", "--micro-batch", "2", "--seq-len", "32"]


class TimeModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tmpdir("machine")
        cls.profile = os.path.join(cls.dir, "machine.json")
        code, out, err, _ = run(["bench", "machine", "--nproc", "2", "--threads", "1", *TINY, "--no-grid",
                                 "--dtypes", "fp32", "--seconds", "0.01", "--max-bytes", "256KiB",
                                 "--disk", cls.dir, "--disk-bytes", "4MiB", "--out", cls.profile], timeout=300)
        assert code == 0, out + err
        cls.bench_out = out

    def test_profile_holds_every_rate_the_model_needs(self):
        p = json.loads(read_bytes(self.profile))
        self.assertEqual((p["ranks"], p["threads"]), (2, 1))
        self.assertGreater(p["stream_bytes_per_s"], 0)
        self.assertGreater(p["optimizer_elements_per_s"], 0)
        self.assertGreater(p["attention_forward"]["fp32"], 0)
        self.assertGreater(p["attention_backward"]["fp32"], 0)
        # tiny: hidden 64, 4 heads of 16 (model/llama_config.cpp); at 2 x 32 tokens the q product is m=64, n=64, k=64,
        # and its dW product m=64 (out), n=64 (in), k=64 (tokens).
        shapes = {(g["m"], g["n"], g["k"]) for g in p["gemm"]}
        self.assertIn((64, 64, 64), shapes)
        self.assertTrue(all(g["flops_per_s"] > 0 for g in p["gemm"]))
        self.assertEqual({c["op"] for c in p["collectives"]},
                         {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p"})
        self.assertIn("wrote " + self.profile, self.bench_out)
        # The disk under --disk at the offload's transfer sizes, and AdamW with compact moments.
        self.assertEqual(p["disk_dir"], self.dir)
        self.assertEqual([d["block_bytes"] for d in p["disk"]], [256 << 10, 1 << 20, 4 << 20])
        for d in p["disk"]:
            for key in ("disk_write_bytes_per_s", "disk_read_bytes_per_s", "disk_stream_bytes_per_s"):
                self.assertGreater(d[key], 0)
        self.assertEqual(set(p["optimizer_state_elements_per_s"]), {"bf16", "8bit"})
        self.assertFalse([f for f in os.listdir(self.dir) if f.startswith("shardlm_disk_probe")])  # removed

    def test_plan_predicts_each_stage_and_search_emits_a_config_that_trains(self):
        code, out, err, _ = run(["plan", *TINY, "--devices", "2", "--precision", "fp32", "--machine", self.profile,
                                 "--json"])
        self.assertEqual(code, 0, out + err)
        predicted = json.loads(out)["predicted"]["stages"]
        self.assertEqual([s["stage"] for s in predicted], [0, 1, 2, 3])
        for s in predicted:
            phases = s["forward_s"] + s["backward_s"] + s["bubble_s"] + s["optimizer_s"] + s["comm_exposed_s"]
            self.assertAlmostEqual(s["step_s"], phases, delta=1e-12 * phases)
            self.assertGreater(s["comm_s_total"], 0)
        cfg = os.path.join(self.dir, "best.json")
        code, out, err, _ = run(["plan", *TINY, "--devices", "2", "--precision", "fp32", "--machine", self.profile,
                                 "--search", "--device-memory", "64MB", "--emit-config", cfg])
        self.assertEqual(code, 0, out + err)
        self.assertIn("fastest predicted first", out)
        first = out.splitlines()[2].split()
        self.assertEqual(first[0], "1")
        emitted = json.loads(read_bytes(cfg))
        # The emitted config is the first line's layout ...
        layout = dict(kv.split("=") for kv in first[1:7])
        self.assertEqual(str(emitted["zero_optimization"]["stage"]), layout["zero"])
        self.assertEqual(emitted["activation_checkpointing"]["mode"], layout["recompute"])
        self.assertEqual(str(emitted["parallelism"]["pipeline_parallel"]), layout["pp"])
        # ... and trains on the bundled data (the tiny preset's vocabulary is the Brown tokenizer's).
        d = os.path.join(self.dir, "run")
        code, out, err, _ = run(["train", "--config", cfg, "--nproc", "2", "--steps=1", "--data.val=", f"--out_dir={d}",
                                 "--model.vocab_size=4096", "--threads=1"], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertEqual([m["step"] for m in read_metrics(d)], [1])

    def test_a_run_given_the_profile_predicts_its_phases_and_diagnoses_itself(self):
        d = os.path.join(self.dir, "diagnosed")
        code, out, err, _ = run(["train", "--config", os.path.join(ROOT, "configs", "demo.json"), "--nproc", "2",
                                 "--threads=1", "--steps=4", "--data.val=", f"--out_dir={d}", "--resume=false",
                                 "--model.preset=tiny", "--model.vocab_size=4096", "--data.seq_len=32",
                                 "--train_micro_batch_size_per_gpu=2", f"--machine_profile={self.profile}"], timeout=300)
        self.assertEqual(code, 0, out + err)
        predicted = json.loads(read_bytes(os.path.join(d, "plan.json")))["predicted"]
        self.assertGreater(predicted["step_s"], 0)
        self.assertIn("2 rank(s) x 1 thread(s)", predicted["machine"])
        self.assertEqual(json.loads(read_bytes(os.path.join(d, "train_config.json")))["machine_profile"], self.profile)
        findings = [line for line in out.splitlines() if line.startswith("shardlm: diagnosis: ")]
        self.assertTrue(findings, out)
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        page = read_bytes(os.path.join(d, "report.html")).decode()
        self.assertIn('id="diagnosis"', page)
        self.assertIn("<td>forward</td>", page)

    def test_bad_profiles_are_refused_naming_the_problem(self):
        bad = os.path.join(self.dir, "bad.json")
        p = json.loads(read_bytes(self.profile))
        p["gemm_rates"] = []
        with open(bad, "w") as f:
            json.dump(p, f)
        code, out, err, _ = run(["plan", *TINY, "--devices", "2", "--machine", bad])
        self.assertNotEqual(code, 0)
        self.assertIn("unknown key 'gemm_rates'", err)
        code, out, err, _ = run(["plan", *TINY, "--devices", "2", "--machine", os.path.join(self.dir, "missing.json")])
        self.assertNotEqual(code, 0)
        self.assertIn("shardlm bench machine --out", err)
        # A bf16 plan on a profile measured in fp32 only says what to measure.
        code, out, err, _ = run(["plan", *TINY, "--devices", "2", "--precision", "bf16", "--machine", self.profile])
        self.assertNotEqual(code, 0)
        self.assertIn("no bf16 GEMM rate", err)
        # A run given a profile it cannot read stops before it starts, naming the file.
        d = os.path.join(self.dir, "bad_run")
        code, out, err, _ = run(["train", "--config", os.path.join(ROOT, "configs", "demo.json"), "--steps=1",
                                 "--data.val=", f"--out_dir={d}", f"--machine_profile={bad}"])
        self.assertNotEqual(code, 0)
        self.assertIn("unknown key 'gemm_rates'", err)
        self.assertFalse(os.path.exists(os.path.join(d, "checkpoints")))


if __name__ == "__main__":
    unittest.main(argv=main_args())
