"""A config written for DeepSpeed runs as it is (issues 12 and 24).

configs/deepspeed_seed.json gives train_batch_size and gradient_accumulation_steps only, so the
micro-batch follows from the job's data-parallel size (256 / (4 x 2) = 32), and its ZeRO-2 keys keep
DeepSpeed's meaning. tests/data/deepspeed/ holds public DeepSpeed configs as their repositories ship
them (SOURCES.md): every one runs a step on the tiny model, or is refused by an error that names one
of its keys; none has a key shardlm drops without a word (each is in train_config.json with the
value given, or named in a `shardlm: config:` notice)."""
import concurrent.futures
import glob
import json
import os
import unittest

from common import ROOT, main_args, read_bytes, read_metrics, run, step_losses, tmpdir

SEED = os.path.join(ROOT, "configs", "deepspeed_seed.json")
CORPUS = os.path.join(ROOT, "tests", "data", "deepspeed")
# The seed config names no model or data: the tiny model over the bundled Brown tokens (4096 pieces);
# a short sequence keeps micro-batches of 32 quick on two cores.
SMALL = ["--model.preset=tiny", "--model.vocab_size=4096", "--data.train=data/brown/train.bin",
         "--data.seq_len=16", "--steps=2", "--resume=false"]
# The corpus' batch sizes are a cluster's (up to 65536 sequences): each runs with a micro-batch of 2,
# accumulation and train_batch_size "auto" (Hugging Face's form: the product), one step.
CORPUS_ARGS = ["--model.preset=tiny", "--model.vocab_size=4096", "--data.train=data/brown/train.bin",
               "--data.seq_len=16", "--steps=1", "--resume=false", "--train_micro_batch_size_per_gpu=2",
               "--gradient_accumulation_steps=auto", "--train_batch_size=auto"]
BATCH_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}


def leaves(node, prefix=""):
    """{dotted path: value} of a JSON object's non-object values."""
    out = {}
    for k, v in node.items():
        path = prefix + k
        if isinstance(v, dict) and path != "model":
            out.update(leaves(v, path + "."))
        else:
            out[path] = v
    return out


def same(given, written):
    if isinstance(given, str) and isinstance(written, str):
        return given.lower() == written.lower()  # optimizer.type "adamw" is written "AdamW"
    if isinstance(given, (int, float)) and not isinstance(given, bool) and isinstance(written, (int, float)):
        return abs(given - written) <= 1e-12 * max(1.0, abs(given))
    return given == written


def corpus():
    """Every config of tests/data/deepspeed (open-instruct names its DeepSpeed JSON files *.conf)."""
    return sorted(glob.glob(os.path.join(CORPUS, "**", "*.json"), recursive=True) +
                  glob.glob(os.path.join(CORPUS, "**", "*.conf"), recursive=True))


def named(err, given):
    """Whether an error names one of the config's keys, or a section of them (`zero_optimization.zenflow`)."""
    keys = set(given)
    for key in given:
        parts = key.split(".")
        keys.update(".".join(parts[:n]) for n in range(1, len(parts)))
    return any(key in err for key in keys)


class DeepSpeedConfig(unittest.TestCase):
    def test_seed_config_runs_on_two_ranks_with_the_derived_micro_batch(self):
        out_dir = os.path.join(tmpdir("dsseed"), "run")
        code, out, err, _ = run(["train", "--config", SEED, "--nproc", "2", f"--out_dir={out_dir}", *SMALL], timeout=300)
        self.assertEqual(code, 0, out + err)
        self.assertIn("micro-batch 32 x seq 16 x accumulation 4 x dp 2", out)
        self.assertIn("ZeRO stage 2, fp16", out)
        m = read_metrics(out_dir)
        self.assertEqual([r["step"] for r in m], [1, 2])
        with open(os.path.join(out_dir, "train_config.json")) as f:
            resolved = json.load(f)
        self.assertEqual((resolved["train_batch_size"], resolved["train_micro_batch_size_per_gpu"],
                          resolved["gradient_accumulation_steps"]), (256, 32, 4))
        self.assertEqual(resolved["zero_optimization"]["reduce_bucket_size"], 2e8)

    def test_a_batch_that_does_not_divide_shows_the_arithmetic(self):
        code, out, err, _ = run(["train", "--config", SEED, "--nproc", "2", "--train_batch_size=100", *SMALL],
                                timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("gradient_accumulation_steps x data-parallel ranks = 4 x 2 = 8", err)
        self.assertEqual(err.count("is not divisible"), 1, "reported once, before ranks start")

    def test_offload_to_cpu_on_a_cpu_run_is_a_notice_and_nvme_needs_zero(self):
        out_dir = os.path.join(tmpdir("dsoffload"), "run")
        code, out, err, _ = run(["train", "--config", SEED, *SMALL, f"--out_dir={out_dir}",
                                 '--zero_optimization.offload_optimizer={"device": "cpu", "pin_memory": true}'],
                                timeout=120)
        self.assertEqual(code, 0, out + err)
        self.assertIn("offload_optimizer.device \"cpu\": on a CPU run the optimizer states already live in host memory",
                      out)
        # NVMe offload runs under ZeRO as DeepSpeed's does (test_nvme_offload.py proves it); without
        # ZeRO it is refused naming the key and the fix, and nothing is written.
        nvme = tmpdir("dsnvme")
        code, out, err, _ = run(["train", "--config", SEED, *SMALL, f"--out_dir={out_dir}2",
                                 '--zero_optimization.offload_optimizer={"device": "nvme", "nvme_path": "' + nvme + '"}'],
                                timeout=120)
        self.assertEqual(code, 0, out + err)
        self.assertIn("on NVMe at " + nvme, out)
        code, out, err, _ = run(["train", "--config", SEED, *SMALL, f"--out_dir={out_dir}3", "--zero_optimization.stage=0",
                                 '--zero_optimization.offload_optimizer={"device": "nvme", "nvme_path": "' + nvme + '"}'],
                                timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("zero_optimization.offload_optimizer.device = \"nvme\" needs ZeRO", err)
        self.assertFalse(os.path.exists(out_dir + "3"))
        code, out, err, _ = run(["train", "--config", SEED, *SMALL,
                                 '--zero_optimization.offload_optimizer={"device": "cpu", "pin_memroy": true}'],
                                timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("unknown config key 'zero_optimization.offload_optimizer.pin_memroy'", err)

    def test_hugging_face_auto_values_are_resolved_into_train_config(self):
        """transformers' own ZeRO-3 test config: every "auto" becomes shardlm's value, the bucket
        sizes HF's hidden-size formulas (tiny: hidden_size 64), and train_config.json shows them."""
        out_dir = os.path.join(tmpdir("dsauto"), "run")
        config = os.path.join(CORPUS, "transformers", "tests", "deepspeed", "ds_config_zero3.json")
        code, out, err, _ = run(["train", "--config", config, "--nproc", "2", f"--out_dir={out_dir}",
                                 "--model.preset=tiny", "--model.vocab_size=4096", "--data.train=data/brown/train.bin",
                                 "--data.seq_len=16", "--steps=2", "--resume=false", "--optimizer.params.lr=2e-3"],
                                timeout=300)
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(out_dir, "train_config.json")) as f:
            r = json.load(f)
        h = 64
        self.assertEqual((r["train_micro_batch_size_per_gpu"], r["gradient_accumulation_steps"], r["train_batch_size"]),
                         (8, 1, 16))  # shardlm's micro-batch 8 and accumulation 1, x 2 ranks
        z = r["zero_optimization"]
        self.assertEqual((z["reduce_bucket_size"], z["stage3_prefetch_bucket_size"],
                          z["stage3_param_persistence_threshold"]), (h * h, int(0.9 * h * h), 10 * h))
        self.assertEqual((r["optimizer"]["params"]["lr"], r["scheduler"]["params"]["warmup_max_lr"]), (2e-3, 2e-3))
        self.assertEqual(r["optimizer"]["params"]["betas"], [0.9, 0.95])  # shardlm's, not FusedAdam's
        self.assertEqual((r["scheduler"]["type"], r["scheduler"]["params"]["warmup_num_steps"]), ("WarmupLR", 1))
        self.assertEqual((r["fp16"]["enabled"], r["bf16"]["enabled"]), (False, False))
        self.assertIn("train_batch_size \"auto\": micro-batch × accumulation × data-parallel ranks = 16", out)
        # WarmupLR with W = max(2, 1): step 1 at warmup_min_lr 0 (DeepSpeed's iteration -1), step 2 at
        # log(1)/log(2) = 0 of the way, i.e. 0 again.
        self.assertEqual([m["lr"] for m in read_metrics(out_dir)], [0.0, 0.0])

    def test_an_auto_shardlm_has_no_value_for_names_the_key_and_the_override(self):
        code, out, err, _ = run(["train", "--config", SEED, *SMALL, "--zero_optimization.allgather_partitions=auto"],
                                timeout=120)
        self.assertNotEqual(code, 0, out + err)
        self.assertIn("zero_optimization.allgather_partitions is \"auto\"", err)
        self.assertIn("--zero_optimization.allgather_partitions=VALUE", err)

    def test_every_corpus_config_runs_or_is_refused_naming_a_key(self):
        files = corpus()
        self.assertGreaterEqual(len(files), 30)
        tally = {"ran": [], "refused naming a key": [], "other": []}
        silent = []
        base = tmpdir("dscorpus")

        def one_step(i, path):
            with open(path) as f:
                given = leaves(json.load(f))
            # DeepSpeed's AutoTP size is shardlm's tensor parallelism: it runs on that many ranks.
            nproc = given.get("tensor_parallel.autotp_size", 1)
            out_dir = os.path.join(base, str(i))
            return given, out_dir, run(["train", "--config", path, "--nproc", str(nproc), f"--out_dir={out_dir}",
                                        *CORPUS_ARGS], timeout=300)

        # Two runs at a time (each is mostly process start-up), checked in the corpus' order.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(one_step, range(len(files)), files))
        for path, (given, out_dir, (code, out, err, _)) in zip(files, results):
            name = os.path.relpath(path, CORPUS)
            if code == 0 and [m["step"] for m in read_metrics(out_dir)] == [1]:
                tally["ran"].append(name)
                with open(os.path.join(out_dir, "train_config.json")) as f:
                    written = leaves(json.load(f))
                notices = [line for line in out.splitlines() if line.startswith("shardlm: config: ")]
                for key, value in given.items():
                    # A notice names the key, or the section DeepSpeed reads as one unit that holds it
                    # (`checkpoint: accepted without effect; ...` for checkpoint.tag_validation).
                    parts = key.split(".")
                    named_by = [key] + [".".join(parts[:n]) for n in range(1, len(parts))]
                    if key in BATCH_KEYS or any(n.startswith("shardlm: config: " + k + " ") or
                                                n.startswith("shardlm: config: " + k + ":")
                                                for n in notices for k in named_by):
                        continue
                    if key in written and (value == "auto" or same(value, written[key])):
                        continue
                    if key.startswith("bfloat16.") and "bf16." + key[len("bfloat16."):] in written:
                        continue  # read as bf16 (a notice names the section)
                    silent.append(f"{name}: {key} = {json.dumps(value)}")
            elif code != 0 and named(err, given):
                tally["refused naming a key"].append(f"{name}: {err.strip().splitlines()[-1][:160]}")
            else:
                tally["other"].append(f"{name}: exit {code}: {(out + err).strip()[-300:]}")
        ran, total = len(tally["ran"]), len(files)
        print(f"\nDeepSpeed corpus: {total} configs: {ran} ran a step ({100.0 * ran / total:.1f}%), "
              f"{len(tally['refused naming a key'])} refused naming a key, {len(tally['other'])} other")
        for line in tally["refused naming a key"] + tally["other"]:
            print("  " + line)
        self.assertEqual(silent, [], "every key given is in train_config.json with its value or named in a notice")
        self.assertEqual(tally["other"], [], "every config runs or is refused naming one of its keys")
        # Measured: 93 of 99 (2026-12-07; 90 before top-level keys DeepSpeed ignores, cuda_visible_devices
        # and comms_config, were accepted and named). The six refused are features that change the
        # arithmetic and are not built (the 1-bit optimizers the pinned DeepSpeed removed, ZenFlow,
        # progressive layer drop, sparse attention): docs/deepspeed.md. A drop below that fails here.
        self.assertGreaterEqual(ran, 93, "the configs that ran a step when this test was written still do")
        self.assertGreaterEqual(ran / total, 0.90)

    def test_bf16_master_keys_train_as_the_shardlm_keys_they_map_to(self):
        """DeepSpeed's bf16.bf16_master_weights_and_grads (with and without bf16_optimizer_states) trains
        bit for bit as the shardlm keys it reads as (optimizer.master_precision "bf16", master_rounding
        "nearest", state_precision, data_types.grad_accum_dtype "bf16"): losses, grad norms, the final
        weights and every rank's final checkpoint shard (bf16 masters and moments), ZeRO-2 and ZeRO-3 on 2
        ranks through the host optimizer (offload_optimizer "cpu", as DeepSpeed runs them). Leaving out
        either half of the mapping (shardlm's default Kahan rounding, or fp32 gradients) changes the run."""
        tiny = os.path.join(ROOT, "configs", "tiny.json")
        base = ["train", "--config", tiny, "--data.val=", "--log_interval=100", "--resume=false", "--steps=3",
                "--nproc", "2", "--bf16.enabled=true", "--zero_optimization.offload_optimizer.device=cpu"]
        shardlm = ["--optimizer.master_precision=bf16", "--optimizer.master_rounding=nearest"]
        root = tmpdir("dsbf16")

        def train(name, *flags):
            out_dir = os.path.join(root, name)
            code, out, err, _ = run(base + [f"--out_dir={out_dir}", *flags], timeout=300)
            self.assertEqual(code, 0, out + err)
            return out_dir, out

        def files(out_dir):
            step = os.path.join(out_dir, "checkpoints", "step-000003")
            return [read_bytes(os.path.join(out_dir, "model.safetensors"))] + [
                read_bytes(os.path.join(step, f"rank-{r:05d}.safetensors")) for r in range(2)]

        for stage, states in ((2, "bf16"), (3, "fp32")):
            zero = f"--zero_optimization.stage={stage}"
            ds, out = train(f"ds{stage}", zero, "--bf16.bf16_master_weights_and_grads=true",
                            f"--bf16.bf16_optimizer_states={'true' if states == 'bf16' else 'false'}")
            self.assertIn("bf16.bf16_master_weights_and_grads true", out)
            sl, _ = train(f"sl{stage}", zero, *shardlm, f"--optimizer.state_precision={states}",
                          "--data_types.grad_accum_dtype=bf16")
            self.assertEqual(len(step_losses(ds)), 3)
            self.assertEqual(step_losses(ds), step_losses(sl), f"stage {stage}")
            self.assertEqual(files(ds), files(sl), f"stage {stage}: final weights and checkpoint shards")
            with open(os.path.join(ds, "train_config.json")) as f:
                written = json.load(f)
            self.assertEqual((written["optimizer"]["master_precision"], written["optimizer"]["master_rounding"],
                              written["optimizer"].get("state_precision", "fp32"),
                              written["data_types"]["grad_accum_dtype"]), ("bf16", "nearest", states, "bf16"))
            if stage == 2:  # each half of the mapping changes the run where it is left out
                kahan, _ = train("kahan", zero, "--optimizer.master_precision=bf16",
                                 f"--optimizer.state_precision={states}", "--data_types.grad_accum_dtype=bf16")
                fp32_grads, _ = train("fp32_grads", zero, *shardlm, f"--optimizer.state_precision={states}")
                for other in (kahan, fp32_grads):
                    self.assertNotEqual(files(ds)[0], files(other)[0], other)


if __name__ == "__main__":
    unittest.main(argv=main_args())
