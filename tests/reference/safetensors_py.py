"""Minimal, dependency-free reader/writer for the safetensors format.

The golden files are written with this module rather than the `safetensors`
package so that their bytes depend only on this code (check_transformers.py reads
them back with the package and checks both readers agree). The (small) format:

    [8 bytes]  N = little-endian uint64, length of the JSON header in bytes
    [N bytes]  UTF-8 JSON object:
                 { "<tensor name>": {"dtype": "F32", "shape": [2, 3],
                                     "data_offsets": [begin, end]},
                   ...,
                   "__metadata__": {"<str>": "<str>", ...} }   (optional)
               padded on the right with spaces (0x20) so that 8 + N is a
               multiple of 8 (the data area then starts 8-byte aligned).
    [rest]     data area: raw little-endian, C-contiguous (row-major) bytes.
               data_offsets are relative to the start of the data area,
               `end` is exclusive; tensors are laid out back to back with no gaps.

A tensor of shape [] (a scalar) has one element; shape [0] has zero bytes.

Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
(The golden files only use F32 and I64.)

Usage:
    save_file({"a": torch.zeros(2, 3)}, "x.safetensors", metadata={"k": "v"})
    tensors, metadata = load_file("x.safetensors")   # dict name -> torch.Tensor
"""

import json
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch

assert sys.byteorder == "little", "this helper assumes a little-endian host"

# safetensors dtype string -> torch dtype
_ST_TO_TORCH = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_TORCH_TO_ST = {v: k for k, v in _ST_TO_TORCH.items()}


def _tensor_to_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16: reinterpret the 16-bit patterns as int16.
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def _bytes_to_tensor(buf: bytes, st_dtype: str, shape) -> torch.Tensor:
    dtype = _ST_TO_TORCH[st_dtype]
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype == torch.bfloat16:
        arr = np.frombuffer(buf, dtype=np.int16).copy()
        return torch.from_numpy(arr).view(torch.bfloat16).reshape(shape)
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    arr = np.frombuffer(buf, dtype=np_dtype).copy()
    return torch.from_numpy(arr).reshape(shape)


def serialize(tensors, metadata=None) -> bytes:
    """Serialize an (ordered) mapping name -> tensor to safetensors bytes.

    Tensors are written in the mapping's iteration order; the JSON header is
    emitted in the same order, so the output is byte-for-byte deterministic.
    """
    header = OrderedDict()
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("safetensors __metadata__ must map str -> str")
        header["__metadata__"] = OrderedDict(metadata)
    chunks = []
    offset = 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved")
        if t.dtype not in _TORCH_TO_ST:
            raise TypeError(f"unsupported dtype {t.dtype} for {name}")
        data = _tensor_to_bytes(t)
        header[name] = OrderedDict(
            [
                ("dtype", _TORCH_TO_ST[t.dtype]),
                ("shape", list(t.shape)),
                ("data_offsets", [offset, offset + len(data)]),
            ]
        )
        chunks.append(data)
        offset += len(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    pad = (-(8 + len(hbytes))) % 8
    hbytes += b" " * pad
    return struct.pack("<Q", len(hbytes)) + hbytes + b"".join(chunks)


def save_file(tensors, path, metadata=None):
    with open(path, "wb") as f:
        f.write(serialize(tensors, metadata))


def deserialize(buf: bytes):
    """Parse safetensors bytes -> (OrderedDict name -> tensor, metadata dict)."""
    if len(buf) < 8:
        raise ValueError("file too short for a safetensors header")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError("header length exceeds file size")
    header = json.loads(buf[8 : 8 + n].decode("utf-8"), object_pairs_hook=OrderedDict)
    metadata = header.pop("__metadata__", None) or {}
    data = buf[8 + n :]
    out = OrderedDict()
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if not (0 <= begin <= end <= len(data)):
            raise ValueError(f"bad data_offsets for {name}")
        t = _bytes_to_tensor(data[begin:end], info["dtype"], info["shape"])
        expected = t.numel() * t.element_size()
        if expected != end - begin:
            raise ValueError(f"{name}: {end - begin} bytes for {expected} expected")
        out[name] = t
    return out, metadata


def load_file(path):
    with open(path, "rb") as f:
        return deserialize(f.read())


def stored_inputs(path, prefixes):
    """The inputs a golden was made from, read back from the committed file: name -> float32 numpy array
    for each tensor whose name starts with one of `prefixes` (bf16 widened exactly). A golden's --check
    recomputes its outputs from these, never by drawing the inputs again: random draws and vectorized
    math (torch.randn, torch.exp) round differently from one CPU to the next."""
    tensors, _ = load_file(path)
    out = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in tensors.items()
           if k.startswith(tuple(prefixes))}
    if not out:
        raise SystemExit(f"{path} holds no tensor named {' or '.join(p + '*' for p in prefixes)}: "
                         "regenerate it by running its script without --check")
    return out


def stored_optimizer_inputs(path, names, steps):
    """An optimizer golden's inputs (stored_inputs): the initial weights init.<name> and each step's
    gradients grad.<t>.<name>, t = 1..steps, as ({name: init}, [{name: gradient} per step])."""
    saved = stored_inputs(path, ("init.", "grad."))
    return ({k: saved[f"init.{k}"] for k in names},
            [{k: saved[f"grad.{t + 1}.{k}"] for k in names} for t in range(steps)])


def write_or_check(store, path, made_by, meta, check):
    """A golden's two modes: write `store` to `path` (its metadata naming the script and `meta`), or,
    with check, exit non-zero unless the file holds exactly those tensors."""
    import sys
    if check:
        saved, _ = load_file(path)
        bad = [k for k in store if k not in saved or not torch.equal(saved[k], store[k])]
        if bad or set(saved) != set(store):
            sys.exit(f"{path} differs from what the script makes: {(bad or sorted(set(saved) ^ set(store)))[:5]}")
        print("golden matches")
        return
    save_file(store, path, {"made_by": made_by, "meta": json.dumps(meta)})
    print("wrote", path)


if __name__ == "__main__":
    # Self-test: round trip every dtype, including a scalar and an empty tensor.
    g = torch.Generator().manual_seed(0)
    ts = OrderedDict()
    ts["f32"] = torch.randn(3, 5, generator=g)
    ts["f64"] = torch.randn(2, generator=g, dtype=torch.float64)
    ts["f16"] = torch.randn(4, 1, generator=g).half()
    ts["bf16"] = torch.randn(7, generator=g).bfloat16()
    ts["i64"] = torch.arange(-3, 3, dtype=torch.int64).reshape(2, 3)
    ts["scalar"] = torch.tensor(1.25)
    ts["empty"] = torch.zeros(0, 4)
    blob = serialize(ts, {"format": "pt"})
    assert (8 + struct.unpack("<Q", blob[:8])[0]) % 8 == 0
    back, meta = deserialize(blob)
    assert meta == {"format": "pt"}
    for k in ts:
        assert back[k].dtype == ts[k].dtype and back[k].shape == ts[k].shape, k
        assert torch.equal(back[k], ts[k]), k
    print("safetensors_py self-test OK")
