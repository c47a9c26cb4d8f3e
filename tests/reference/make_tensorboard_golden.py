#!/usr/bin/env python3
"""Golden TensorBoard event records, written by the pinned `tensorboard` package's own writer.

    /opt/shardlm/venv/bin/python tests/reference/make_tensorboard_golden.py           # write the golden
    /opt/shardlm/venv/bin/python tests/reference/make_tensorboard_golden.py --check   # compare with it

shardlm encodes event files by hand (src/observe/tensorboard_writer.cpp, no protobuf library), so
tests/unit/observe/test_tensorboard_writer.cpp encodes the same four events and compares its bytes
with tests/golden/tensorboard_events.bin, which this script writes with tensorboard's RecordWriter
(TFRecord framing, masked CRC-32C) around event_pb2.Event messages serialised by protobuf itself:
  1. file_version "brain.Event:2", wall_time 1765000000.25, source_metadata.writer "shardlm"
     (what EventFileWriter writes first, with shardlm's name);
  2. SessionLog START at step 7 (as torch's SummaryWriter(purge_step=7) writes it), the same wall_time;
  3. step 300, wall_time 1765000012.5: train/loss 2.75, train/learning_rate 3e-4, train/grad_norm NaN,
     train/tokens_per_s 123456.789, train/zero 0.0, train/negative -1e-20, train/huge 1e39 (inf as a
     float32);
  4. step 2**40 (a 6-byte varint), wall_time 0 (left out): eval/loss 0.5.
The unit test keeps these values in step with the list below.
"""
import argparse
import io
import math
import os
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "tensorboard_events.bin")
WALL = 1765000000.25


def scalars(step, wall, values):
    return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values]))


def events():
    return [
        event_pb2.Event(wall_time=WALL, file_version="brain.Event:2",
                        source_metadata=event_pb2.SourceMetadata(writer="shardlm")),
        event_pb2.Event(wall_time=WALL, step=7, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)),
        scalars(300, 1765000012.5, [("train/loss", 2.75), ("train/learning_rate", 3e-4), ("train/grad_norm", math.nan),
                                    ("train/tokens_per_s", 123456.789), ("train/zero", 0.0),
                                    ("train/negative", -1e-20), ("train/huge", 1e39)]),
        scalars(2**40, 0.0, [("eval/loss", 0.5)]),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    buf = io.BytesIO()
    writer = RecordWriter(buf)
    for e in events():
        writer.write(e.SerializeToString())
    data = buf.getvalue()
    if args.check:
        with open(OUT, "rb") as f:
            old = f.read()
        if old != data:
            sys.exit(f"{OUT} differs from what tensorboard writes ({len(old)} vs {len(data)} bytes): regenerate it with "
                     "tests/reference/make_tensorboard_golden.py")
        print(f"{OUT}: identical ({len(data)} bytes)")
        return
    with open(OUT, "wb") as f:
        f.write(data)
    print(f"wrote {OUT} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
