"""`shardlm report RUN_DIR`: train a tiny 2-rank ZeRO-3 fp16 run (started at a loss scale of 2^24 so
the first steps overflow and are skipped), write the report, open it in headless Chromium (Debian's
`chromium`, installed by scripts/setup.sh) and check that every chart rendered with the run's numbers:
the page's own check script sets the title to "report-ok", the browser logs no console message, the
screenshot is far from blank, and the SVG elements carry the values of metrics.jsonl / memory.json /
plan.json. Bad run directories fail naming the file."""
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import unittest

from common import ROOT, main_args, read_metrics, run, tmpdir

TINY = os.path.join(ROOT, "configs", "tiny.json")
CHARTS = ["chart-loss", "chart-tokens-per-s", "chart-lr", "chart-grad-norm", "chart-loss-scale", "chart-memory",
          "chart-step-time", "chart-comm-bytes"]
MEMORY_CATEGORIES = ["compute_params", "gradients", "master_params", "optimizer_states", "gathered_peak"]
SCREEN = (1200, 2400)


def chromium_binary():
    path = shutil.which("chromium") or (os.path.exists("/usr/bin/chromium") and "/usr/bin/chromium")
    if not path:
        raise AssertionError("headless Chromium is required to check the HTML report but `chromium` is not installed: "
                             "run scripts/setup.sh (Debian package chromium)")
    return path


def chromium(args, timeout=180):
    """Runs headless Chromium with a fresh profile and nothing that reaches the network."""
    profile = tempfile.mkdtemp(prefix="shardlm_chromium_")
    try:
        cmd = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}"] + args
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(url, path):
    p = chromium([f"--window-size={SCREEN[0]},{SCREEN[1]}", f"--screenshot={path}", url])
    assert p.returncode == 0 and os.path.exists(path), f"chromium --screenshot failed ({p.returncode}):\n{p.stderr[-3000:]}"
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24]), os.path.getsize(path)


class Svg(html.parser.HTMLParser):
    """Collects every chart <svg> and the elements inside it (tag + attributes), and the page <title>."""

    def __init__(self):
        super().__init__()
        self.charts, self.current, self.page_title, self.in_head_title, self.depth = {}, None, None, False, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "chart" in a.get("class", "").split():
            self.current, self.depth = a["id"], 0
            self.charts[self.current] = {"attrs": a, "elements": [], "text": []}
        elif self.current:
            if tag == "svg":
                self.depth += 1
            self.charts[self.current]["elements"].append((tag, a))
        elif tag == "title" and self.page_title is None:
            self.in_head_title = True

    def handle_endtag(self, tag):
        if tag == "svg" and self.current:
            if self.depth == 0:
                self.current = None
            else:
                self.depth -= 1
        if tag == "title":
            self.in_head_title = False

    def handle_data(self, data):
        if self.in_head_title:
            self.page_title = (self.page_title or "") + data
        elif self.current:
            self.charts[self.current]["text"].append(data)


def series(chart, name=None, cls=None):
    out = []
    for tag, a in chart["elements"]:
        classes = a.get("class", "").split()
        if "series" in classes and (name is None or a.get("data-name") == name) and (cls is None or cls in classes):
            out.append(a)
    return out


def bars(chart, stack=None):
    return [a for tag, a in chart["elements"] if tag == "rect" and "bar" in a.get("class", "").split()
            and (stack is None or a.get("data-stack") == stack)]


def render(testcase, report, charts=CHARTS):
    """Opens the report in headless Chromium; returns the parsed DOM after its scripts ran."""
    p = chromium(["--enable-logging=stderr", "--v=0", "--dump-dom", "file://" + report])
    testcase.assertEqual(p.returncode, 0, p.stderr[-3000:])
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    testcase.assertEqual(console, [], "the page logged to the console")
    dom = Svg()
    dom.feed(p.stdout)
    testcase.assertEqual(dom.page_title, "report-ok", "the page's check script found a problem")
    testcase.assertEqual(sorted(dom.charts), sorted(charts))
    return dom


def copy_run(src, names, prefix):
    dst = tmpdir(prefix)
    for n in names:
        if os.path.exists(os.path.join(src, n)):
            shutil.copy(os.path.join(src, n), dst)
    return dst


class ReportRendersInChromium(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        chromium_binary()  # fail at once, naming the fix, when Chromium is missing
        cls.run_dir = tmpdir("report_run")
        code, out, err, secs = run(["train", "--config", TINY, "--nproc", "2", "--steps=30", f"--out_dir={cls.run_dir}",
                                    "--resume=false", "--zero_optimization.stage=3", "--fp16.enabled=true",
                                    "--fp16.initial_scale_power=24", "--log_interval=10", "--eval_interval=5"])
        assert code == 0, out + err
        print(f"2-rank ZeRO-3 fp16 run: {secs:.1f}s")
        cls.metrics = read_metrics(cls.run_dir)
        with open(os.path.join(cls.run_dir, "memory.json")) as f:
            cls.memory = json.load(f)
        assert sum(r["skipped"] for r in cls.metrics) > 0, "no step was skipped: the loss-scale chart is not exercised"
        # Without a plan (the trainer may write one: keep it for the planned-bars test).
        cls.trainer_plan = None
        plan_path = os.path.join(cls.run_dir, "plan.json")
        if os.path.exists(plan_path):
            with open(plan_path) as f:
                cls.trainer_plan = json.load(f)
            os.remove(plan_path)
        code, out, err, _ = run(["report", cls.run_dir])
        assert code == 0, out + err
        cls.report = os.path.join(cls.run_dir, "report.html")
        assert out.strip() == f"wrote {cls.report}", out

    def test_page_is_self_contained(self):
        with open(self.report) as f:
            page = f.read()
        self.assertTrue(page.startswith("<!DOCTYPE html>"))
        self.assertNotRegex(page, r"(?i)\s(src|href)\s*=", "the page references another file")
        self.assertNotIn("http://", page)
        self.assertNotIn("https://", page)
        self.assertNotIn("@import", page)
        self.assertEqual(re.findall(r"url\((?!#)", page), [], "CSS url() other than an in-page fragment")

    def test_charts_render_with_the_run_numbers(self):
        dom = render(self, self.report)
        for cid in CHARTS:
            self.assertEqual(dom.charts[cid]["attrs"].get("data-rendered"), "data", cid + " drew no data")
        n = len(self.metrics)
        steps = [r["step"] for r in self.metrics]
        evals = [r for r in self.metrics if r.get("val_loss") is not None]
        skipped = [r["step"] for r in self.metrics if r["skipped"]]

        loss = dom.charts["chart-loss"]
        self.assertEqual(series(loss, "training loss")[0]["data-points"], str(n))
        self.assertEqual(series(loss, "validation loss", "markers")[0]["data-points"], str(len(evals)))
        self.assertEqual(series(dom.charts["chart-tokens-per-s"], "tokens/s")[0]["data-points"], str(n))
        self.assertEqual(series(dom.charts["chart-lr"], "learning rate")[0]["data-points"], str(n))
        # grad_norm is null on skipped steps: a gap in the line, a marker on the axis.
        gn = dom.charts["chart-grad-norm"]
        self.assertEqual(series(gn, "gradient norm")[0]["data-points"], str(n - len(skipped)))
        self.assertEqual(series(gn, cls="skip-markers")[0]["data-points"], str(len(skipped)))
        ls = dom.charts["chart-loss-scale"]
        self.assertEqual(series(ls, "loss scale")[0]["data-points"], str(n))
        self.assertEqual(series(ls, cls="skip-markers")[0]["data-points"], str(len(skipped)))
        self.assertIn(f"skipped step ({int(self.metrics[-1]['skipped_steps'])} in all)", "".join(ls["text"]))

        # Memory: memory.json's bytes per category, stacked; no plan.json, said in the chart.
        mem = dom.charts["chart-memory"]
        measured = {a["data-category"]: float(a["data-value"]) for a in bars(mem) if a["data-stack"].startswith("measured")}
        for k in MEMORY_CATEGORIES:
            if self.memory[k] > 0:
                self.assertEqual(measured[k], self.memory[k], k)
        self.assertEqual(bars(mem, "plan.json"), [])
        self.assertIn("no plan.json", "".join(mem["text"]))

        # Time per step: data loading = time_data_s; compute = step_time_s - sum of waits - data loading;
        # exposed per op = comm_<op>_wait_s.
        time_bars = bars(dom.charts["chart-step-time"])
        self.assertEqual({a["data-stack"] for a in time_bars}, {str(s) for s in steps})
        for r in self.metrics:
            got = {a["data-category"]: float(a["data-value"]) for a in time_bars if a["data-stack"] == str(r["step"])}
            waits = {k[5:-7]: v for k, v in r.items() if k.startswith("comm_") and k.endswith("_wait_s")}
            compute = sum(v for k, v in got.items() if k.startswith("compute"))
            self.assertGreater(r["time_data_s"], 0)
            self.assertAlmostEqual(got["data loading"], r["time_data_s"], delta=1e-9 + 1e-9 * r["step_time_s"])
            self.assertAlmostEqual(compute, r["step_time_s"] - sum(waits.values()) - r["time_data_s"],
                                   delta=1e-9 + 1e-9 * r["step_time_s"])
            # Overlapped: in flight minus waited, summed over operations, capped at the compute time.
            overlap = sum(max(0.0, r[f"comm_{op}_inflight_s"] - w) for op, w in waits.items())
            self.assertAlmostEqual(got["compute with comm in flight (overlapped)"], min(overlap, compute),
                                   delta=1e-9 + 1e-9 * r["step_time_s"])
            for op, w in waits.items():
                if w > 0:
                    self.assertAlmostEqual(got["exposed " + op], w, delta=1e-12 + 1e-9 * w)

        comm = dom.charts["chart-comm-bytes"]
        for op in ("all_gather", "reduce_scatter"):
            self.assertEqual(series(comm, op, "markers")[0]["data-points"], str(n), op)

    def test_screenshot_shows_the_charts(self):
        shots = tmpdir("report_shots")
        (w, h), size = screenshot("file://" + self.report, os.path.join(shots, "report.png"))
        self.assertEqual((w, h), SCREEN)
        blank_page = os.path.join(shots, "blank.html")
        with open(blank_page, "w") as f:
            f.write("<!DOCTYPE html><html><head><title>blank</title></head><body></body></html>")
        _, blank = screenshot("file://" + blank_page, os.path.join(shots, "blank.png"))
        self.assertGreater(size, 8 * blank, f"report screenshot ({size} bytes) is barely larger than a blank page's ({blank})")
        print(f"screenshot: {os.path.join(shots, 'report.png')} ({size} bytes; blank page {blank})")

    def test_planned_bars_next_to_measured(self):
        # The planner's format: one entry per ZeRO stage under "stages"; the report picks the run's stage.
        d = copy_run(self.run_dir, ["metrics.jsonl", "memory.json", "train_config.json"], "report_plan")
        plan = self.trainer_plan
        if plan is None:
            planned = {k: self.memory[k] for k in MEMORY_CATEGORIES}
            planned.update(activations=3 << 20, comm_buffers=1 << 20)
            plan = {"stages": [dict(planned, stage=0, total=1), dict(planned, stage=self.memory["stage"],
                                                                      total=sum(planned.values()))]}
        with open(os.path.join(d, "plan.json"), "w") as f:
            json.dump(plan, f)
        out_file = os.path.join(d, "elsewhere.html")
        code, out, err, _ = run(["report", d, "--out", out_file])
        self.assertEqual(code, 0, out + err)
        self.assertFalse(os.path.exists(os.path.join(d, "report.html")))
        dom = render(self, out_file)
        entry = next(s for s in plan["stages"] if s["stage"] == self.memory["stage"])
        got = {a["data-category"].replace(" (not measured)", ""): float(a["data-value"])
               for a in bars(dom.charts["chart-memory"], "plan.json")}
        want = {k: float(entry[k]) for k in MEMORY_CATEGORIES + ["activations", "comm_buffers"] if entry.get(k, 0) > 0}
        self.assertEqual(got, want)

    def test_run_without_fp16_or_memory_says_why(self):
        # A bare metrics.jsonl (fp32, no evaluation, no memory.json): the charts with nothing to draw say why.
        d = tmpdir("report_bare")
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for s in range(1, 6):
                f.write(json.dumps({"step": s, "loss": 5 - 0.1 * s, "lr": 1e-3, "grad_norm": 1.0 / s,
                                    "tokens_per_s": 1000.0 + s, "step_time_s": 0.1, "comm_all_reduce_bytes": 4096.0,
                                    "comm_all_reduce_wait_s": 0.01}) + "\n")
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        dom = render(self, os.path.join(d, "report.html"))
        for cid in ("chart-loss-scale", "chart-memory"):
            self.assertEqual(dom.charts[cid]["attrs"].get("data-rendered"), "no-data", cid)
        self.assertIn("fp16 is not enabled", "".join(dom.charts["chart-loss-scale"]["text"]))
        self.assertIn("no memory.json", "".join(dom.charts["chart-memory"]["text"]))
        self.assertEqual(dom.charts["chart-loss"]["attrs"].get("data-rendered"), "data")


class ReportRefusesBadInput(unittest.TestCase):
    def check_error(self, args, *fragments):
        code, out, err, _ = run(["report"] + args)
        self.assertEqual(code, 1, out + err)
        for frag in fragments:
            self.assertIn(frag, err)
        return err

    def test_missing_directory(self):
        d = os.path.join(tmpdir("report_missing"), "nope")
        self.check_error([d], d, "does not exist")

    def test_missing_metrics(self):
        d = tmpdir("report_nometrics")
        self.check_error([d], os.path.join(d, "metrics.jsonl"), "does not exist")

    def test_corrupt_metrics_line(self):
        d = tmpdir("report_corrupt")
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.\n')
        self.check_error([d], os.path.join(d, "metrics.jsonl"), "line 2", "not valid JSON")
        self.assertFalse(os.path.exists(os.path.join(d, "report.html")))

    def test_record_without_step_and_steps_out_of_order(self):
        d = tmpdir("report_nostep")
        path = os.path.join(d, "metrics.jsonl")
        with open(path, "w") as f:
            f.write('{"loss": 5.0}\n')
        self.check_error([d], path, "line 1", '"step"')
        with open(path, "w") as f:
            f.write('{"step": 2, "loss": 5.0}\n{"step": 1, "loss": 4.0}\n')
        self.check_error([d], path, "line 2", "step 1 follows step 2")

    def test_empty_metrics(self):
        d = tmpdir("report_empty")
        open(os.path.join(d, "metrics.jsonl"), "w").close()
        self.check_error([d], os.path.join(d, "metrics.jsonl"), "no steps")

    def test_corrupt_memory_json(self):
        d = tmpdir("report_badmem")
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write('{"step": 1, "loss": 5.0}\n')
        with open(os.path.join(d, "memory.json"), "w") as f:
            f.write('{"stage": 3, ')
        self.check_error([d], os.path.join(d, "memory.json"), "not valid JSON")


class PipelineTimeline(unittest.TestCase):
    """A pp=2 run writes every stage's forward, backward, send and receive intervals per micro-batch
    (pipeline_timeline.jsonl: the first three steps and the last) in the order of its schedule, on one
    time base (a stage receives micro-batch m only after its neighbour computed it); the report draws
    them and the bubble per step against (p-1)/(m+p-1)."""

    M = 4

    def train(self, schedule, steps):
        out_dir = tmpdir("report_pp_" + schedule)
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", "2", f"--steps={steps}", f"--out_dir={out_dir}",
                                 "--resume=false", "--parallelism.pipeline_parallel=2",
                                 f"--parallelism.pipeline_schedule={schedule}", f"--gradient_accumulation_steps={self.M}",
                                 "--train_micro_batch_size_per_gpu=1"])
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(out_dir, "pipeline_timeline.jsonl")) as f:
            records = [json.loads(line) for line in f]
        return out_dir, records

    def check_record(self, record, compute_order):
        M = self.M
        self.assertEqual(record["micro_batches"], M)
        stages = record["stages"]
        self.assertEqual([s["stage"] for s in stages], [0, 1])
        by = {}
        for s in stages:
            names = [e[0] for e in s["events"]]
            expected = {"forward": M, "backward": M}
            expected.update({"send_activation": M, "recv_gradient": M} if s["stage"] == 0 else
                            {"recv_activation": M, "send_gradient": M})
            self.assertEqual({n: names.count(n) for n in set(names)}, expected, f"stage {s['stage']}")
            for name, m, start, end, *_chunk in s["events"]:
                self.assertLessEqual(start, end)
                self.assertGreaterEqual(start, 0)
                by[(s["stage"], name, m)] = (start, end)
            compute = [e for e in s["events"] if e[0] in ("forward", "backward")]
            self.assertEqual([(e[0][0].upper(), e[1]) for e in compute], compute_order[s["stage"]])
            for a, b in zip(compute, compute[1:]):
                self.assertLessEqual(a[3], b[2] + 1e-6, "a stage computes one thing at a time")
        for m in range(M):
            # Stage 1 has micro-batch m's activations only after stage 0 computed them, and stage 0
            # its gradient only after stage 1's backward: the stages share one clock.
            self.assertGreaterEqual(by[(1, "recv_activation", m)][1] + 1e-6, by[(0, "forward", m)][1])
            self.assertGreaterEqual(by[(1, "forward", m)][0] + 1e-6, by[(0, "forward", m)][1])
            self.assertGreaterEqual(by[(0, "backward", m)][0] + 1e-6, by[(1, "backward", m)][1])

    def test_1f1b_timeline_and_report(self):
        out_dir, records = self.train("1f1b", 5)
        self.assertEqual([r["step"] for r in records], [1, 2, 3, 5])
        order = {0: [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
                 1: [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]}
        metrics = {r["step"]: r for r in read_metrics(out_dir)}
        for record in records:
            self.check_record(record, order)
            for s in record["stages"]:
                self.assertAlmostEqual(s["bubble"], metrics[record["step"]][f"pipeline_bubble.stage{s['stage']}"])
        code, out, err, _ = run(["report", out_dir])
        self.assertEqual(code, 0, out + err)
        dom = render(self, os.path.join(out_dir, "report.html"),
                     CHARTS + ["chart-pipeline-timeline", "chart-pipeline-bubble"])
        timeline = dom.charts["chart-pipeline-timeline"]
        self.assertEqual([int(a["data-points"]) for a in series(timeline)], [4 * self.M, 4 * self.M])
        titles = [d for d in timeline["text"] if "of micro-batch" in d]
        self.assertEqual(len(titles), 8 * self.M, "one rectangle with a tooltip per event")
        self.assertEqual(dom.charts["chart-pipeline-bubble"]["attrs"].get("data-rendered"), "data")

    def test_gpipe_runs_every_forward_first(self):
        _, records = self.train("gpipe", 1)
        self.assertEqual([r["step"] for r in records], [1])
        gpipe = [("F", m) for m in range(self.M)] + [("B", m) for m in range(self.M)]
        self.check_record(records[0], {0: gpipe, 1: gpipe})


def zb_h1_order(stage, stages, micro):
    """ZB-H1 by its definition (Qi et al. 2023, sec. 3.1): 1F1B's p - s - 1 warm-up forwards, then
    one forward and one B (input gradient) per micro-batch, stage s deferring its W (weight gradient)
    by s micro-batches, the deferred ones last."""
    warmup = min(stages - stage - 1, micro)
    order = [("F", m) for m in range(warmup)]
    bs = 0
    for f in range(warmup, micro + warmup):
        if f < micro:
            order.append(("F", f))
        order.append(("B", bs))
        if bs >= stage:
            order.append(("W", bs - stage))
        bs += 1
    order += [("W", m) for m in range(micro - stage, micro)]
    return order


class PipelineSchedulesTimeline(unittest.TestCase):
    """The new schedules' timelines: ZB-H1's compute order on every stage at p = 2 and 4 is its
    definition (B then W, W deferred by the stage), B's gradient reaches the stage below before that
    stage's B starts; interleaved 1F1B records each (micro-batch, chunk) once, F before B, and wraps
    activations from the last stage to the first for chunk 1."""

    M = 4

    def train(self, name, nproc, extra):
        out_dir = tmpdir("report_sched_" + name)
        code, out, err, _ = run(["train", "--config", TINY, "--nproc", str(nproc), "--steps=1", f"--out_dir={out_dir}",
                                 "--resume=false", f"--parallelism.pipeline_parallel={nproc}",
                                 f"--gradient_accumulation_steps={self.M}", "--train_micro_batch_size_per_gpu=1",
                                 "--model.num_hidden_layers=4"] + extra)
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(out_dir, "pipeline_timeline.jsonl")) as f:
            return out_dir, json.loads(f.readline())

    def test_zb_h1_order_at_two_and_four_stages(self):
        letter = {"forward": "F", "backward": "B", "backward_weight": "W"}
        for p in (2, 4):
            out_dir, record = self.train(f"zb_h1_{p}", p, ["--parallelism.pipeline_schedule=zb_h1"])
            self.assertEqual(record["schedule"], "zb_h1")
            by = {}
            for s in record["stages"]:
                compute = [e for e in s["events"] if e[0] in letter]
                self.assertEqual([(letter[e[0]], e[1]) for e in compute], zb_h1_order(s["stage"], p, self.M),
                                 f"p={p} stage {s['stage']}")
                for a, b in zip(compute, compute[1:]):
                    self.assertLessEqual(a[3], b[2] + 1e-6, "a stage computes one thing at a time")
                for e in s["events"]:
                    by[(s["stage"], e[0], e[1])] = (e[2], e[3])
            for st in range(p - 1):
                for m in range(self.M):
                    self.assertGreaterEqual(by[(st, "backward", m)][0] + 1e-6, by[(st + 1, "backward", m)][1])
            code, out, err, _ = run(["report", out_dir])
            self.assertEqual(code, 0, out + err)

    def test_interleaved_records_every_chunk_and_wraps(self):
        _, record = self.train("interleaved", 2, ["--parallelism.pipeline_schedule=interleaved_1f1b",
                                                  "--parallelism.virtual_pipeline_parallel=2"])
        self.assertEqual((record["schedule"], record["chunks"]), ("interleaved_1f1b", 2))
        self.assertAlmostEqual(record["bubble_formula"], 1 / (2 * self.M + 1))
        by = {}
        for s in record["stages"]:
            for name, m, start, end, chunk in s["events"]:
                self.assertNotIn((s["stage"], name, m, chunk), by)
                by[(s["stage"], name, m, chunk)] = (start, end)
        for st in range(2):
            for m in range(self.M):
                for c in range(2):
                    self.assertLess(by[(st, "forward", m, c)][1], by[(st, "backward", m, c)][0] + 1e-6)
        for m in range(self.M):
            # Chunk 1 on stage 0 runs on what stage 1's chunk 0 computed (the wrap-around).
            self.assertGreaterEqual(by[(0, "forward", m, 1)][0] + 1e-6, by[(1, "forward", m, 0)][1])
            self.assertIn((1, "send_activation", m, 0), by)
            self.assertIn((0, "recv_activation", m, 1), by)


class ReportCutMetricsAndRankMemory(unittest.TestCase):
    """No browser needed: the page's text is checked."""

    def test_cut_last_line_renders_what_is_there(self):
        # A run killed (or out of disk) while writing step 3: the line has no newline and stops mid-record.
        d = tmpdir("report_cut")
        good = [json.dumps({"step": s, "loss": 5.0 - s, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 100.0,
                            "step_time_s": 0.1}) for s in (1, 2)]
        cut = json.dumps({"step": 3, "loss": 2.0, "lr": 1e-3})[:-9]
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write("\n".join(good) + "\n" + cut)
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(d, "report.html")) as f:
            page = f.read()
        self.assertIn("metrics.jsonl was cut", page)
        self.assertIn("line 3", page)
        self.assertIn("the 2 complete records", page)
        # A complete file says nothing of the kind; a bad line that is not the last one still fails.
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write("\n".join(good) + "\n")
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(d, "report.html")) as f:
            self.assertNotIn("metrics.jsonl was cut", f.read())
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write(good[0] + "\n" + cut + "\n" + good[1] + "\n")
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 1, out + err)
        self.assertIn("line 2", err)

    def test_memory_per_rank_table_and_imbalance(self):
        # Keys as the trainer writes them (observe/rank_memory.h): rank 1 peaks at 1.5x rank 0.
        d = tmpdir("report_rank_memory")
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for s, (r0, r1) in enumerate([(400e6, 500e6), (420e6, 630e6)], start=1):
                f.write(json.dumps({"step": s, "loss": 5.0, "memory_peak_rss.rank0": r0, "memory_peak_rss.rank1": r1,
                                    "memory_peak_rss_imbalance": max(r0, r1) / min(r0, r1)}) + "\n")
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        with open(os.path.join(d, "report.html")) as f:
            page = f.read()
        self.assertIn('id="memory-per-rank"', page)
        self.assertIn("<td>1</td><td>630.0 MB</td><td>630.0 MB</td>", page)
        self.assertIn("<td>0</td><td>420.0 MB</td><td>420.0 MB</td>", page)
        self.assertIn("<b>1.500</b>", page)  # 630 / 420 over the run
        self.assertIn("worst step: 1.500", page)



class ExpertsChart(unittest.TestCase):
    def test_tokens_per_expert_drawn_from_the_metrics(self):
        # A 2-layer Mixtral of 4 experts with a capacity factor that drops tokens: the report draws each
        # expert's share of the step's routed tokens (moe_tokens_expert_<e> / their sum) and names the
        # dropped tokens and the aux loss; the run's own numbers are checked against the page.
        chromium_binary()
        d = tmpdir("report_moe")
        code, out, err, _ = run(["train", "--config", os.path.join(ROOT, "configs", "moe_demo.json"), "--steps=4",
                                 f"--out_dir={d}", "--resume=false", "--data.val=", "--data.seq_len=32",
                                 "--train_micro_batch_size_per_gpu=2", "--model.num_hidden_layers=2",
                                 "--model.num_local_experts=4", "--model.moe_capacity_factor=0.75", "--log_interval=1"])
        self.assertEqual(code, 0, out + err)
        metrics = read_metrics(d)
        self.assertEqual(sum(sum(m[f"moe_tokens_expert_{e}"] for e in range(4)) + m["moe_dropped_tokens"]
                             for m in metrics), 4 * 2 * 32 * 2 * 2, "every token's 2 copies in 2 layers counted")
        self.assertGreater(sum(m["moe_dropped_tokens"] for m in metrics), 0, "the capacity factor dropped none")
        code, out, err, _ = run(["report", d])
        self.assertEqual(code, 0, out + err)
        dom = render(self, os.path.join(d, "report.html"), CHARTS + ["chart-experts"])
        chart = dom.charts["chart-experts"]
        self.assertEqual(chart["attrs"].get("data-rendered"), "data")
        self.assertEqual([a.get("data-name") for a in series(chart)], [f"expert {e}" for e in range(4)] + ["balanced (1/4)"])
        self.assertEqual({int(a["data-points"]) for a in series(chart)}, {4})
        with open(os.path.join(d, "report.html")) as f:
            page = f.read()
        dropped = sum(m["moe_dropped_tokens"] for m in metrics)
        self.assertIn(f"<b>moe_dropped_tokens</b> (over the capacity factor's limit): {dropped:,.0f} in all", page)

if __name__ == "__main__":
    unittest.main(argv=main_args())
