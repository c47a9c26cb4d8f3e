#!/usr/bin/env python3
"""Writes tests/unit/io/data/python_fixture.safetensors by hand (struct + json, no safetensors
package), so shardlm's C++ reader is checked against an independent writer. The expected values
are hard-coded in test_safetensors.cpp; change both together.

Deliberate quirks: the JSON header lists tensors in a different order than their data, so the
reader must order by data_offsets; file order is not alphabetical; there is a scalar and an empty
tensor; the header is padded with spaces to a multiple of 8 like the official writer does.
Run: /opt/shardlm/venv/bin/python tests/unit/io/make_fixture.py
"""
import json
import os
import struct


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16(values):
    # The values below are exact in bf16, so dropping the low 16 bits of the f32 is exact.
    out = b""
    for v in values:
        bits = f32_bits(v)
        assert bits & 0xFFFF == 0, f"{v} is not exact in bf16"
        out += struct.pack("<H", bits >> 16)
    return out


# (name, dtype, shape, bytes) in data (file) order.
TENSORS = [
    ("z.weight", "F32", [2, 3], struct.pack("<6f", 1.5, -2.0, 0.25, 3.0, -0.125, 1e-3)),
    ("a.bias", "BF16", [4], bf16([1.0, -0.5, 3.140625, -65536.0])),
    ("m.half", "F16", [2, 2], struct.pack("<4e", 0.5, -1.0, 65504.0, 6.103515625e-05)),
    ("ids", "I64", [3], struct.pack("<3q", -1, 0, 2**40 + 7)),
    ("scalar", "F64", [], struct.pack("<d", 2.718281828459045)),
    ("empty", "I32", [0, 5], b""),
    ("mask", "BOOL", [5], bytes([1, 0, 0, 1, 1])),
    ("bytes", "U8", [3], bytes([0, 127, 255])),
    ("small", "I8", [2], struct.pack("<2b", -128, 127)),
    ("shorts", "I16", [2], struct.pack("<2h", -32768, 1234)),
    ("ints", "I32", [2], struct.pack("<2i", -7, 2147483647)),
]


def main():
    entries = {}
    offset = 0
    for name, dtype, shape, data in TENSORS:
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    # Header order: metadata last, tensors reversed, unlike the data order.
    header = {name: entries[name] for name, *_ in reversed(TENSORS)}
    header["__metadata__"] = {"format": "pt", "source": "make_fixture.py"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "data", "python_fixture.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for *_, data in TENSORS:
            f.write(data)


if __name__ == "__main__":
    main()
