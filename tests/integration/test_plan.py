"""`shardlm plan` end to end (tensor-parallel layouts included), the activation estimate against a
measured training step, and the trainer refusing a run whose plan does not fit device_memory."""
import json
import os
import unittest

from common import ROOT, main_args, read_bytes, run, tmpdir

DEMO = os.path.join(ROOT, "configs", "demo.json")


class Plan(unittest.TestCase):
    def test_json_plan_and_emitted_config(self):
        d = tmpdir("plan")
        cfg_path = os.path.join(d, "recommended.json")
        code, out, err, _ = run(["plan", "--model", "llama-7b", "--devices", "8", "--device-memory", "32GB",
                                 "--json", "--emit-config", cfg_path])
        self.assertEqual(code, 0, out + err)
        plan = json.loads(out)
        self.assertEqual([s["stage"] for s in plan["stages"]], [0, 1, 2, 3])
        self.assertEqual(plan["recommendation"]["zero_stage"], 3)
        self.assertFalse(plan["stages"][0]["fits"])
        self.assertTrue(plan["recommendation"]["reasons"])
        self.assertEqual(json.loads(read_bytes(cfg_path))["zero_optimization"]["stage"], 3)

    def test_bf16_masters_drop_the_fp32_master_and_kahan_adds_two_bytes(self):
        d = tmpdir("plan_bf16_masters")
        cfg_path = os.path.join(d, "recommended.json")
        base = ["plan", "--model", "llama-7b", "--devices", "8", "--device-memory", "32GB", "--json"]
        plans = {}
        for masters in (["fp32"], ["bf16", "--master-rounding", "kahan"], ["bf16", "--master-rounding", "stochastic"]):
            extra = ["--emit-config", cfg_path] if masters[-1] == "kahan" else []
            code, out, err, _ = run(base + ["--master-precision"] + masters + extra)
            self.assertEqual(code, 0, out + err)
            plans[masters[-1]] = {s["stage"]: s for s in json.loads(out)["stages"]}
        for stage in range(4):
            fp32, kahan, sr = plans["fp32"][stage], plans["kahan"][stage], plans["stochastic"][stage]
            self.assertGreater(fp32["master_params"], 0)
            self.assertEqual(kahan["master_params"], 0)
            self.assertEqual(sr["master_params"], 0)
            self.assertEqual(sr["optimizer_states"], fp32["optimizer_states"])
            # the compensation: bf16, half the fp32 master's bytes
            self.assertEqual(kahan["optimizer_states"] - fp32["optimizer_states"], fp32["master_params"] // 2)
        emitted = json.loads(read_bytes(cfg_path))
        self.assertEqual(emitted["optimizer"]["master_precision"], "bf16")
        self.assertEqual(emitted["optimizer"]["master_rounding"], "kahan")
        self.assertTrue(emitted["bf16"]["enabled"])
        code, out, err, _ = run(base[:-1] + ["--precision", "fp32", "--master-precision", "bf16"])
        self.assertNotEqual(code, 0)
        self.assertIn("--master-precision bf16 needs --precision bf16", out + err)
        # Optimizer offload pages the bf16 master's state (moments + compensation) to disk.
        code, out, err, _ = run(base + ["--master-precision", "bf16", "--offload-optimizer", "nvme", "--nvme-path", d])
        self.assertEqual(code, 0, out + err)
        for s in json.loads(out)["stages"][1:]:
            self.assertEqual(s["offloaded"], plans["kahan"][s["stage"]]["optimizer_states"])
            self.assertEqual((s["master_params"], s["optimizer_states"]), (0, 0))

    def test_tensor_parallel_plan_and_emitted_config(self):
        # tiny at tp=2: each rank holds 54592 of the 108864 parameters (tests/unit/plan/test_planner.cpp).
        d = tmpdir("plan_tp")
        cfg_path = os.path.join(d, "recommended.json")
        args = ["plan", "--model", "tiny", "--devices", "4", "--tp", "2", "--sp", "--seq-len", "64",
                "--precision", "fp32", "--emit-config", cfg_path]
        code, out, err, _ = run(args)
        self.assertEqual(code, 0, out + err)
        self.assertIn("each rank holds 54592 of the 108864 parameters", out)
        self.assertIn("tp_all_gather", out)
        self.assertIn("tp_reduce_scatter", out)
        emitted = json.loads(read_bytes(cfg_path))
        self.assertEqual(emitted["parallelism"]["tensor_parallel"], 2)
        self.assertEqual(emitted["parallelism"]["sequence_parallel"], True)
        self.assertEqual(emitted["parallelism"]["pipeline_parallel"], 1)
        self.assertEqual(emitted["activation_checkpointing"]["mode"], "none")
        code, out, err, _ = run(args[:-2] + ["--json", "--zero-stage", "0"])
        self.assertEqual(code, 0, out + err)
        plan = json.loads(out)
        self.assertEqual((plan["dp"], plan["tp"], plan["parameters_per_rank"]), (2, 2, 54592))
        self.assertEqual(plan["stages"][0]["total_model_states"], 16 * 54592)
        self.assertEqual(set(k for k in plan["stages"][0]["comm_bytes_per_step"] if k.startswith("tp_")),
                         {"tp_all_gather", "tp_reduce_scatter", "tp_all_reduce"})

    def test_tensor_parallel_refuses_impossible_layouts(self):
        code, out, err, _ = run(["plan", "--model", "tiny", "--devices", "3", "--tp", "3", "--seq-len", "64"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("num_attention_heads", err)
        self.assertIn("4 / 3", err)  # tiny has 4 heads
        code, out, err, _ = run(["plan", "--model", "tiny", "--devices", "2", "--tp", "2", "--sp", "--seq-len", "63"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("63 / 2", err)

    def test_pipeline_plan_prints_each_stage_and_the_bubble(self):
        # The seed's 64-device example: 8 DP x 4 TP x 2 PP, 8 micro-batches: bubble 1/9.
        for model in ("llama-7b", "llama-13b"):
            args = ["plan", "--model", model, "--devices", "64", "--tp", "4", "--pp", "2", "--accumulation", "8"]
            code, out, err, _ = run(args)
            self.assertEqual(code, 0, out + err)
            print(out)
            self.assertIn("dp=8 tp=4 pp=2", out)
            self.assertIn("per pipeline stage", out)
            self.assertIn("pp stage 0", out)
            self.assertIn("pp stage 1", out)
            self.assertIn("peak: pipeline stage", out)
            self.assertIn("(p-1)/(m+p-1) = 0.111", out)
            code, out, err, _ = run(args + ["--json"])
            self.assertEqual(code, 0, out + err)
            plan = json.loads(out)
            stages = plan["pipeline_stages"]
            self.assertEqual([s["stage"] for s in stages], [0, 1])
            self.assertAlmostEqual(plan["pipeline_bubble"], 1 / 9)
            layers = 32 if model == "llama-7b" else 40
            self.assertEqual(sum(s["layers"] for s in stages), layers)
            # Together the stages hold one tensor-parallel rank's parameters (untied: nothing twice).
            self.assertEqual(sum(s["parameters"] for s in stages), plan["parameters_per_rank"])
            self.assertEqual([s["micro_batches_alive"] for s in stages], [2, 1])  # 1F1B: min(p - s, m)
            for z, zero in enumerate(plan["stages"]):
                peak = max(s["memory"][z]["total"] for s in stages)
                self.assertEqual(zero["total"], peak, "the largest pipeline stage is what must fit")
            code, out, err, _ = run(args + ["--json", "--schedule", "gpipe"])
            self.assertEqual(code, 0, out + err)
            self.assertEqual([s["micro_batches_alive"] for s in json.loads(out)["pipeline_stages"]], [8, 8])

    def test_activation_estimate_within_15_percent_of_a_measured_step(self):
        # memory.json's activations_held: allocator bytes in use after the first forward (glibc
        # mallinfo2), i.e. what backward reads; plan.json: the planner's estimate for the same run.
        # MKL's GEMM buffer pool is left out of the activations (MKL_DISABLE_FAST_MM=1, as below): its
        # size depends on the processor (27 MB of the 136 MB measured for fp32 on an AVX-512 FP16 Xeon,
        # where the activations alone were 108.8 MB against 108.3 MB predicted). The peak is checked
        # on a run with the pool, as users run: the plan's allocator allowance includes it.
        for extra in ([], ["--zero_optimization.stage=1", "--bf16.enabled=true"], ["--data.seq_len=256"],
                      ["--attn_implementation=eager"],
                      ["--activation_checkpointing.mode=selective", "--attn_implementation=eager"]):
            # The peak with MKL's pool (check_peak) once per precision and attention kernel: seq 256 and
            # selective recomputation change only the activations, which the pool-less run checks.
            peak_runs = "--data.seq_len=256" not in extra and "--activation_checkpointing.mode=selective" not in extra
            for pool in (False, True) if peak_runs else (False,):
                d = tmpdir("act")
                code, out, err, _ = run(["train", "--config", DEMO, "--steps=1", "--data.val=", f"--out_dir={d}",
                                         "--resume=false", "--train_micro_batch_size_per_gpu=4",
                                         "--data.seq_len=128", "--threads=1", *extra],
                                        extra_env=None if pool else {"MKL_DISABLE_FAST_MM": "1"})
                self.assertEqual(code, 0, out + err)
                if pool:
                    # bf16: the peak with MKL's pool varies from run to run even in one arena, with
                    # native bf16 products (oneDNN: 289.6-322.5 MB over 5 runs on an AVX-512 FP16 Xeon,
                    # planned 331.5 MB) and with 16-bit products in fp32 (AVX2-only: 345.1-386.3 MB over
                    # 4 runs, planned 398.0 MB), so the over-prediction side allows 15% for bf16, as the
                    # 2-rank ZeRO-3 test does; the under-prediction side stays at 10%.
                    bf16 = "--bf16.enabled=true" in extra
                    self.check_peak(d, " ".join(extra) or "fp32", over=0.15 if bf16 else 0.10)
                    continue
                measured = json.loads(read_bytes(os.path.join(d, "memory.json")))["activations_held"]
                predicted = json.loads(read_bytes(os.path.join(d, "plan.json")))["stages"][0]["activations"]
                print(f"{' '.join(extra) or 'fp32'}: activations measured {measured / 1e6:.1f} MB, "
                      f"predicted {predicted / 1e6:.1f} MB ({measured / predicted:.3f})")
                self.assertLess(abs(measured - predicted), 0.15 * measured)

    def test_moe_activation_estimate_within_5_percent_of_a_measured_step(self):
        # The sparse layers' activations (plan/activations.cpp, mlp_kept_per_token): the top-k copies'
        # rows, expert SwiGLUs and outputs, the router's softmax and the shared expert, measured as in
        # the test above (fp32; measured 0.4-0.5% above the plan for Mixtral, Qwen2-MoE and Qwen2-MoE
        # with every other layer dense, 0.8% for bf16 with fp32 products).
        moe = json.loads(read_bytes(os.path.join(ROOT, "configs", "moe_demo.json")))
        qwen = dict(moe)
        qwen["model"] = {k: v for k, v in moe["model"].items() if k not in ("num_local_experts", "intermediate_size")}
        qwen["model"].update({"model_type": "qwen2_moe", "num_experts": 8, "intermediate_size": 1024,
                              "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512,
                              "decoder_sparse_step": 2})
        qwen_path = os.path.join(tmpdir("qwen_moe_cfg"), "qwen2_moe.json")
        with open(qwen_path, "w") as f:
            json.dump(qwen, f)
        for name, config in (("mixtral", os.path.join(ROOT, "configs", "moe_demo.json")), ("qwen2_moe", qwen_path)):
            d = tmpdir("act_moe")
            code, out, err, _ = run(["train", "--config", config, "--steps=1", "--data.val=", f"--out_dir={d}",
                                     "--resume=false", "--train_micro_batch_size_per_gpu=4", "--data.seq_len=128",
                                     "--threads=1"], extra_env={"MKL_DISABLE_FAST_MM": "1"})
            self.assertEqual(code, 0, out + err)
            measured = json.loads(read_bytes(os.path.join(d, "memory.json")))["activations_held"]
            predicted = json.loads(read_bytes(os.path.join(d, "plan.json")))["stages"][0]["activations"]
            print(f"{name}: activations measured {measured / 1e6:.1f} MB, predicted {predicted / 1e6:.1f} MB "
                  f"({measured / predicted:.3f})")
            self.assertLess(abs(measured - predicted), 0.05 * measured)

    def check_peak(self, dirs, what, over=0.10):
        # The step's peak: model states plus the resident set's growth over the first forward + backward
        # (memory.json), against the plan's total (backward's temporaries and the allocator included),
        # within 10% either way: on CPUs with bf16 dot products and on those computing 16-bit products
        # in fp32 (plan.json's products_in_fp32; AVX2-only CPUs). One malloc arena makes the peak the
        # same from run to run (cli/launch.h) in one process on one thread (seq 256, fp32: 539.5-541.0 MB
        # over 3 runs); with two threads the order in which their blocks interleave in the heap moves
        # it (485.5-553.5 MB over 3 runs against a plan of 527.1 MB), so these runs use --threads=1.
        # ZeRO-3 frees its gathered units during the step; whether the head's backward temporaries land
        # in those holes depends on when the blocks are freed, so its plan gives both ends: `total`
        # (no reuse) and `total - backward_reusable` (reuse). Every run must lie between them, 10%
        # either way (`over` below for a run whose peak moves otherwise); `dirs` may hold repeats.
        if isinstance(dirs, str):
            dirs = [dirs]
        for d in dirs:
            memory = json.loads(read_bytes(os.path.join(d, "memory.json")))
            whole = json.loads(read_bytes(os.path.join(d, "plan.json")))
            plan = whole["stages"][0]
            peak = memory["total_model_states"] + memory["activations_measured"]
            low = plan["total"] - plan["backward_reusable"]
            print(f"{what}: peak measured {peak / 1e6:.1f} MB, planned {low / 1e6:.1f}-{plan['total'] / 1e6:.1f} MB "
                  f"(backward temporaries {plan['backward_peak'] / 1e6:.1f} MB; {peak / plan['total']:.3f} of the "
                  f"total; 16-bit products in fp32: {whole['products_in_fp32']})")
            self.assertLess(peak - plan["total"], 0.10 * peak, "the plan under-predicts the peak")
            self.assertLess(low - peak, over * peak, "the plan over-predicts the peak")

    def test_peak_within_10_percent_zero3_two_ranks(self):
        # The peak of two ranks varies from run to run in two modes (cf. check_peak): fp32, demo model,
        # 327-336 MB (no reuse; plan 339.1) or 292.6-298.4 MB (reuse; plan 288.8), the second in every
        # run with overlap_comm off, by turns with it (AVX2-only and AVX-512 CPUs alike). Each precision runs
        # once with overlapped reduce-scatters and once without; every run must lie between the two ends.
        for precision in ([], ["--bf16.enabled=true"], ["--fp16.enabled=true"]):
            dirs = []
            for repeat, overlap in enumerate(("true", "false")):
                d = tmpdir(f"peak_z3_{repeat}")
                code, out, err, _ = run(["train", "--config", DEMO, "--nproc", "2", "--steps=1", "--data.val=",
                                         f"--out_dir={d}", "--resume=false", "--threads=1",
                                         "--train_micro_batch_size_per_gpu=4", "--data.seq_len=128",
                                         "--zero_optimization.stage=3", f"--zero_optimization.overlap_comm={overlap}",
                                         *precision])
                self.assertEqual(code, 0, out + err)
                dirs.append(d)
            self.check_peak(dirs, "zero-3, 2 ranks " + (" ".join(precision) or "fp32"))

    def test_full_activation_checkpointing_prediction_and_drop(self):
        # Full recomputation keeps each layer's input plus the head. That total is small enough that
        # MKL's GEMM buffer pool, which the heap measurement also sees (about 5.4 MB per thread here:
        # 21.6 MB held with one thread, 26.4 MB with two, 15.5 MB without the pool), would exceed
        # 15% of it; MKL_DISABLE_FAST_MM=1 leaves the pool out, so activations alone are compared.
        held = {}
        for mode in ("none", "full"):
            d = tmpdir("ac_" + mode)
            code, out, err, _ = run(["train", "--config", DEMO, "--steps=1", "--data.val=", f"--out_dir={d}",
                                     "--resume=false", "--train_micro_batch_size_per_gpu=4", "--data.seq_len=128",
                                     f"--activation_checkpointing.mode={mode}"], extra_env={"MKL_DISABLE_FAST_MM": "1"})
            self.assertEqual(code, 0, out + err)
            held[mode] = json.loads(read_bytes(os.path.join(d, "memory.json")))["activations_held"]
            plan = json.loads(read_bytes(os.path.join(d, "plan.json")))["stages"][0]
            print(f"activation checkpointing {mode}: held after forward {held[mode] / 1e6:.1f} MB, predicted "
                  f"{plan['activations'] / 1e6:.1f} MB + {plan['recompute_peak'] / 1e6:.1f} MB rebuilt in backward")
            self.assertLess(abs(held[mode] - plan["activations"]), 0.15 * held[mode])
        self.assertLess(held["full"], 0.3 * held["none"])

    def test_tensor_parallel_activations_predicted_and_checkpointing_drops_them(self):
        # tp=2 on 2 ranks (rank 0's memory.json), MKL's pool left out as above: without sequence
        # parallelism only the parallel regions are split; with it the norms and the residual stream
        # too; full recomputation keeps each layer's input.
        held = {}
        for sp, mode in (("false", "none"), ("false", "selective"), ("false", "full"), ("true", "none"),
                         ("true", "full")):
            d = tmpdir(f"tp_ac_{sp}_{mode}")
            code, out, err, _ = run(["train", "--config", DEMO, "--nproc", "2", "--steps=1", "--data.val=",
                                     f"--out_dir={d}", "--resume=false", "--threads=1",
                                     "--train_micro_batch_size_per_gpu=4", "--data.seq_len=128",
                                     "--parallelism.tensor_parallel=2", f"--parallelism.sequence_parallel={sp}",
                                     f"--activation_checkpointing.mode={mode}"], extra_env={"MKL_DISABLE_FAST_MM": "1"})
            self.assertEqual(code, 0, out + err)
            held[sp, mode] = json.loads(read_bytes(os.path.join(d, "memory.json")))["activations_held"]
            plan = json.loads(read_bytes(os.path.join(d, "plan.json")))["stages"][0]
            print(f"tp=2 sequence_parallel={sp} recompute {mode}: held after forward {held[sp, mode] / 1e6:.1f} MB, "
                  f"predicted {plan['activations'] / 1e6:.1f} MB ({held[sp, mode] / plan['activations']:.3f})")
            self.assertLess(abs(held[sp, mode] - plan["activations"]), 0.15 * held[sp, mode])
        self.assertLess(held["false", "full"], 0.3 * held["false", "none"])
        self.assertLess(held["true", "none"], held["false", "none"])

    def test_trainer_refuses_a_run_that_does_not_fit(self):
        d = os.path.join(tmpdir("refuse"), "run")
        code, out, err, _ = run(["train", "--config", DEMO, "--nproc", "2", "--device_memory=350MB",
                                 f"--out_dir={d}", "--data.val="])
        self.assertNotEqual(code, 0)
        self.assertIn("does not fit device_memory", err)
        self.assertIn("smallest change that fits: --", err)
        self.assertEqual(err.count("does not fit device_memory"), 1, "reported once, before ranks start")
        self.assertFalse(os.path.exists(d), "nothing should be written for a refused run")


if __name__ == "__main__":
    unittest.main(argv=main_args())
