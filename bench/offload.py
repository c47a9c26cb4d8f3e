#!/usr/bin/env python3
"""NVMe offload against the same run without it, side by side in one run of this script: optimizer
states (zero_optimization.offload_optimizer.device "nvme", ZeRO stage 1) and parameters
(zero_optimization.offload_param.device "nvme", ZeRO stage 3): resident memory, step time, losses, and
the bandwidth of the disk under nvme_path, measured here too.

    /opt/shardlm/venv/bin/python bench/offload.py [--shardlm build/shardlm] [--nvme DIR] [--repeats 3]
        [--out bench/results/offload.json]

Trains the demo model (configs/demo.json, 1 rank x 1 thread) for a few steps in fp32 and in bf16, alternating
the runs with and without offload, `repeats` times each:
- "states": ZeRO stage 1, optimizer offload (bf16 also offloads the fp32 masters); what it saves is
  the master + optimizer bytes of memory.json;
- "params": ZeRO stage 3 against ZeRO stage 3 with parameter offload (max_in_cpu 0: every sharded
  unit's shard on disk); what it saves is memory.json's "offloaded" (the parameter shards).
Per run:
- resident memory = the process's peak RSS in the steps after the first (metrics.jsonl
  memory_peak_rss_max; the initial states are written out before training, then freed) plus the
  page cache the offload files hold, sampled every 250 ms while the run trains (mincore over each
  offload file: direct I/O should keep it near zero);
- step time: the median step_time_s over the steps after the first of all repeats (and the same of
  the optimizer step alone, time_optimizer_s, where offload's cost lies);
- losses of every step (must be bit-identical with and without offload).
Then the disk: O_DIRECT write, rewrite in place (offload's writes, so its write bandwidth) and read
of 256 MiB in 4 MiB blocks in the same directory, from which the I/O time of one step follows: states are read and written once; parameter shards are read by
the forward and again by the backward (the units kept gathered between them, at most the window,
are not: this counts them anyway), by the fp32 step (its master is the shard; a 16-bit step casts
the masters into a fresh shard), and written once.

Done-when thresholds (issue 24): resident memory lower by >= 90% of the offloaded states' bytes;
step time <= 1.3x without offload, or what offload adds to the step within 1.3x of the state I/O
time at the measured bandwidth; losses bit-identical.
"""
import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGE = mmap.PAGESIZE


def cached_bytes(path):
    """Bytes of the file in the page cache (mincore over a read-only mapping, as fincore does)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        ok = libc.mincore(ctypes.c_void_p(addr), size, vec) == 0
        libc.munmap(ctypes.c_void_p(addr), size)
        return sum(v & 1 for v in vec) * PAGE if ok else 0
    finally:
        os.close(fd)


# What each comparison offloads: the ZeRO stage, the flags with offload, the prefix of its files.
KINDS = {
    "states": (1, lambda nvme: ["--zero_optimization.offload_optimizer.device=nvme",
                                f"--zero_optimization.offload_optimizer.nvme_path={nvme}"], "shardlm_states"),
    "params": (3, lambda nvme: ["--zero_optimization.offload_param.device=nvme",
                                f"--zero_optimization.offload_param.nvme_path={nvme}",
                                "--zero_optimization.offload_param.max_in_cpu=0"], "shardlm_params"),
}


def train(shardlm, out_dir, extra, steps, what="states", nvme=None):
    """One run; returns its metrics rows, its log, and the largest page cache its offload files held."""
    stage, flags, prefix = KINDS[what]
    cmd = [shardlm, "train", "--config", os.path.join(REPO, "configs", "demo.json"), f"--steps={steps}", "--data.val=",
           f"--out_dir={out_dir}", "--resume=false", "--log_interval=1", f"--zero_optimization.stage={stage}",
           "--threads=1", *extra]
    if nvme:
        cmd += flags(nvme)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    peak_cache = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            if nvme:
                total = sum(cached_bytes(os.path.join(nvme, f)) for f in os.listdir(nvme) if f.startswith(prefix))
                peak_cache[0] = max(peak_cache[0], total)
            time.sleep(0.25)  # mincore over every file: sampled more often, it slowed the offloaded runs

    t = threading.Thread(target=sample)
    t.start()
    log, _ = p.communicate()
    stop.set()
    t.join()
    if p.returncode != 0:
        raise SystemExit(f"shardlm failed:\n{log}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return rows, log, peak_cache[0]


def disk_bandwidth(directory, total=256 << 20, block=4 << 20):
    """O_DIRECT write, rewrite in place, then read of `total` bytes in `block` pieces: bytes/s each.
    Offload rewrites its files in place (util/direct_file_store.h), so the rewrite is its write speed."""
    path = os.path.join(directory, "bandwidth_probe")
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(block))
    flags = os.O_DIRECT if hasattr(os, "O_DIRECT") else 0

    def write_pass(open_flags):
        fd = os.open(path, open_flags | flags)
        t0 = time.perf_counter()
        for i in range(total // block):
            os.pwritev(fd, [buf], i * block)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
        os.close(fd)
        return total / seconds

    try:
        write = write_pass(os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        rewrite = write_pass(os.O_WRONLY)
        fd = os.open(path, os.O_RDONLY | flags)
        t0 = time.perf_counter()
        for i in range(total // block):
            os.preadv(fd, [buf], i * block)
        read = total / (time.perf_counter() - t0)
        os.close(fd)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return write, rewrite, read


def compare(args, nvme, what, name, extra):
    """Plain and offloaded runs of one kind and precision, alternating; their summary."""
    runs = {"plain": [], "offload": []}
    for _ in range(args.repeats):
        for kind in ("plain", "offload"):
            with tempfile.TemporaryDirectory() as d:
                rows, log, cache = train(args.shardlm, d, extra, args.steps, what, nvme if kind == "offload" else None)
                with open(os.path.join(d, "memory.json")) as f:
                    mem = json.load(f)
            with_io = re.search(r"(?:optimizer states \([^)]*\)|parameters) ([0-9.]+ [KMG]i?B) on NVMe at \S+ \(([^)]*)\)",
                                log)
            runs[kind].append({
                "losses": [r["loss"] for r in rows],
                "step_times_s": [r["step_time_s"] for r in rows[1:]],
                "optimizer_times_s": [r["time_optimizer_s"] for r in rows[1:]],
                "peak_rss": max(r["memory_peak_rss_max"] for r in rows[1:]),
                "offload_file_cache": cache,
                "io_path": with_io.group(2) if with_io else None,
                "memory": mem,
            })
    # The bytes offload takes out of memory, by memory.json of a plain run (states) or an offloaded one (params).
    if what == "states":
        mem = runs["plain"][0]["memory"]
        offloaded = mem["optimizer_states"] + mem["master_params"]
    else:
        offloaded = runs["offload"][0]["memory"]["offloaded"]
    med = lambda kind, key: statistics.median(r[key] for r in runs[kind])
    resident_plain = med("plain", "peak_rss")
    resident_off = statistics.median(r["peak_rss"] + r["offload_file_cache"] for r in runs["offload"])
    pooled = lambda kind, key: statistics.median(t for r in runs[kind] for t in r[key])
    step_plain, step_off = pooled("plain", "step_times_s"), pooled("offload", "step_times_s")
    opt_plain, opt_off = pooled("plain", "optimizer_times_s"), pooled("offload", "optimizer_times_s")
    for r in runs["plain"] + runs["offload"]:
        del r["memory"]
    return {
        "zero_stage": KINDS[what][0],
        "offloaded_bytes": offloaded,
        # Bytes moved per step (see the docstring): states once each way; parameters read 2x (3x in fp32).
        "bytes_read_per_step": offloaded if what == "states" else offloaded * (3 if name == "fp32" else 2),
        "bytes_written_per_step": offloaded,
        "resident_without_offload": resident_plain,
        "resident_with_offload": resident_off,
        "resident_saved_fraction_of_offloaded": (resident_plain - resident_off) / offloaded,
        "offload_file_page_cache_max": max(r["offload_file_cache"] for r in runs["offload"]),
        "step_time_without_s": step_plain,
        "step_time_with_s": step_off,
        "step_time_ratio": step_off / step_plain,
        "optimizer_time_without_s": opt_plain,
        "optimizer_time_with_s": opt_off,
        "losses_bit_identical": all(r["losses"] == runs["plain"][0]["losses"] for r in runs["plain"] + runs["offload"]),
        "io_path": runs["offload"][0]["io_path"],
        "runs": runs,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", default=os.path.join(REPO, "build", "shardlm"))
    ap.add_argument("--nvme", default=None, help="directory for the offload files (default: a fresh one under /var/tmp)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--kinds", default="states,params", help="which offloads to compare: states, params or both")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    nvme = args.nvme or tempfile.mkdtemp(prefix="shardlm_offload_", dir="/var/tmp")
    results = {"model": "demo", "ranks": 1, "threads": 1, "steps": args.steps, "repeats": args.repeats,
               "nvme_path": nvme, "load_average_before": os.getloadavg()[0], "offloads": {}}
    for what in args.kinds.split(","):
        results["offloads"][what] = {
            name: compare(args, nvme, what, name, extra)
            for name, extra in {"fp32": [], "bf16": ["--bf16.enabled=true"]}.items()}
    first_write_bw, write_bw, read_bw = disk_bandwidth(nvme)
    results["disk_first_write_bytes_per_s"] = first_write_bw
    results["disk_write_bytes_per_s"], results["disk_read_bytes_per_s"] = write_bw, read_bw  # write: in place
    results["load_average_after"] = os.getloadavg()[0]
    ok = True
    for what, precisions in results["offloads"].items():
        for name, r in precisions.items():
            io_time = r["bytes_read_per_step"] / read_bw + r["bytes_written_per_step"] / write_bw
            r["io_time_at_disk_bandwidth_s"] = io_time
            # The step is within the threshold when it takes at most 1.3x the step without offload, or when
            # what offload adds to it is at most 1.3x the I/O time at the measured bandwidth (the disk, not
            # the code, is then what the step waits for).
            r["step_overhead_s"] = r["step_time_with_s"] - r["step_time_without_s"]
            r["optimizer_overhead_s"] = r["optimizer_time_with_s"] - r["optimizer_time_without_s"]
            r["step_within_thresholds"] = r["step_time_ratio"] <= 1.3 or r["step_overhead_s"] <= 1.3 * io_time
            r["resident_within_threshold"] = r["resident_saved_fraction_of_offloaded"] >= 0.9
            ok = ok and r["step_within_thresholds"] and r["resident_within_threshold"] and r["losses_bit_identical"]
            print(f"{what} {name} (ZeRO-{r['zero_stage']}): offloaded {r['offloaded_bytes'] / 1e6:.1f} MB "
                  f"({r['io_path']}); resident {r['resident_without_offload'] / 1e6:.1f} -> "
                  f"{r['resident_with_offload'] / 1e6:.1f} MB (saved {100 * r['resident_saved_fraction_of_offloaded']:.0f}% "
                  f"of the offloaded bytes; files in page cache at most {r['offload_file_page_cache_max'] / 1e6:.2f} MB); "
                  f"step {r['step_time_without_s'] * 1e3:.0f} -> {r['step_time_with_s'] * 1e3:.0f} ms "
                  f"(x{r['step_time_ratio']:.2f}; optimizer step {r['optimizer_time_without_s'] * 1e3:.0f} -> "
                  f"{r['optimizer_time_with_s'] * 1e3:.0f} ms; I/O at disk bandwidth {io_time * 1e3:.0f} ms); losses "
                  f"bit-identical: {r['losses_bit_identical']}")
    print(f"disk under {nvme}: O_DIRECT write {write_bw / 1e6:.0f} MB/s, read {read_bw / 1e6:.0f} MB/s; "
          f"load average {results['load_average_before']:.2f} before, {results['load_average_after']:.2f} after")
    results["all_thresholds_met"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    if not args.nvme:
        os.rmdir(nvme)


if __name__ == "__main__":
    main()
