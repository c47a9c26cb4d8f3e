"""Shared helpers for the command-line tests: run the shardlm binary and read its outputs."""
import json
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

SHARDLM = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.abspath("build/shardlm")
ROOT = os.environ.get("SHARDLM_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(args, timeout=600, extra_env=None, **kw):
    """Runs shardlm with args (and extra_env on top of ENV); returns (exit code, stdout, stderr, seconds)."""
    t0 = time.time()
    env = dict(ENV, **(extra_env or {}))
    p = subprocess.run([SHARDLM] + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, **kw)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def tmpdir(prefix):
    """A fresh directory, removed when the test program exits (unless SHARDLM_KEEP_TMP is set)."""
    path = tempfile.mkdtemp(prefix="shardlm_" + prefix + "_")
    if not os.environ.get("SHARDLM_KEEP_TMP"):
        atexit.register(shutil.rmtree, path, True)
    return path


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_losses(out_dir):
    """(step, loss, grad_norm) of every metrics.jsonl record: what bit-identity tests compare."""
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(out_dir)]


class TrainsTheBase:
    """A TestCase mixin for offload tests: train(out_dir, *flags) runs the class's BASE arguments on
    nproc ranks for `steps` steps (the class's STEPS), asserts exit 0, returns stdout + stderr."""
    STEPS = 3

    def train(self, d, *flags, nproc=2, steps=None):
        code, out, err, _ = run(self.BASE + ["--nproc", str(nproc), f"--steps={steps or self.STEPS}",
                                             f"--out_dir={d}", *flags])
        self.assertEqual(code, 0, out + err)
        return out + err


def main_args():
    """unittest.main() would treat the binary path as a test name."""
    return [sys.argv[0]] + sys.argv[2:]


def write_llmc(path, tokens, bits=16):
    """Writes an llm.c .bin token file: 256 int32 header (magic, version, count), then the tokens as
    uint16 (bits=16: magic 20240520, version 1) or uint32 (bits=32: magic 20240801, version 7)."""
    import struct
    magic, version, code = (20240520, 1, "H") if bits == 16 else (20240801, 7, "I")
    header = struct.pack("<3i", magic, version, len(tokens)) + b"\0" * (256 * 4 - 12)
    with open(path, "wb") as f:
        f.write(header + struct.pack(f"<{len(tokens)}{code}", *tokens))


def session_pids(sid):
    """Processes of session `sid` (a job started with start_new_session=True: the ranks keep the
    session even where mpirun puts them in process groups of their own)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile
    return pids


def kill_session(sid):
    """SIGKILL to every process of session `sid`."""
    import signal
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile


def read_llmc(path):
    """An llm.c .bin token file (write_llmc's layout): (magic, version, the ids as a list)."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    code = {1: "H", 7: "I"}[version]
    width = 2 if code == "H" else 4
    return magic, version, list(struct.unpack(f"<{count}{code}", data[1024:1024 + count * width]))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)
