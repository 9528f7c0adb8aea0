"""safetensors files read one tensor at a time and written tensor by tensor, with numpy only (bf16 via ml_dtypes).

Why not the `safetensors` package: its numpy reader has no bfloat16 and its flax reader returns device arrays;
loading a model through either puts whole files in memory. Here a file's header (8-byte little-endian length, then
JSON `{name: {dtype, shape, data_offsets}}`) is read and checked against the file size first (a truncated file is
named with its first missing tensor), and a tensor's bytes are read on demand with `np.fromfile` into memory that is
freed with the array. The writer lays out the header from the shapes alone and then streams each tensor's bytes,
so an export never holds more than one tensor on the host.
"""
from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32)}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 << 20  # the format's own limit


class FormatError(ValueError):
  """A file that is not (or no longer) a valid safetensors file; the message names the file and the tensor."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: str
  name: str
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int  # absolute byte offset of the data in `file`
  nbytes: int


def read_header(path: str) -> dict[str, TensorInfo]:
  """{tensor name: TensorInfo} of one file, every entry checked against the file's size."""
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise FormatError(f"{path}: {size} bytes, too short for a safetensors header (truncated or empty file).")
      (n,) = struct.unpack("<Q", head)
      if n > _MAX_HEADER or 8 + n > size:
        raise FormatError(f"{path}: header length {n} does not fit the {size}-byte file (truncated or not a "
                          "safetensors file).")
      header = json.loads(f.read(n))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise FormatError(f"{path}: unreadable safetensors header ({e}).") from None
  if not isinstance(header, dict):
    raise FormatError(f"{path}: the safetensors header is not a JSON object.")
  out, base = {}, 8 + n
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    try:
      code = entry["dtype"]
      shape = tuple(int(d) for d in entry["shape"])
      begin, end = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
      raise FormatError(f"{path}: tensor {name!r}: malformed header entry {entry!r}.") from None
    if code not in DTYPES:
      raise FormatError(f"{path}: tensor {name!r}: dtype {code!r} is not supported (use one of {sorted(DTYPES)}).")
    dtype = DTYPES[code]
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if end - begin != want or begin < 0:
      raise FormatError(f"{path}: tensor {name!r}: {end - begin} data bytes for shape {list(shape)} "
                        f"{entry['dtype']} (needs {want}).")
    if base + end > size:
      raise FormatError(f"{path}: truncated: tensor {name!r} needs bytes up to {base + end}, the file has {size}.")
    out[name] = TensorInfo(path, name, dtype, shape, base + begin, want)
  return out


def read_metadata(path: str) -> dict:
  """The header's `__metadata__` (string to string; {} when absent or the header does not read)."""
  try:
    with open(path, "rb") as f:
      (n,) = struct.unpack("<Q", f.read(8))
      if n > _MAX_HEADER or 8 + n > os.path.getsize(path):
        return {}
      meta = json.loads(f.read(n)).get("__metadata__")
  except (OSError, ValueError, struct.error, AttributeError):
    return {}
  return meta if isinstance(meta, dict) else {}


def read(info: TensorInfo) -> np.ndarray:
  """One tensor in its stored dtype, in fresh memory (no mapping of the file is kept)."""
  count = info.nbytes // info.dtype.itemsize
  arr = np.fromfile(info.file, dtype=info.dtype, count=count, offset=info.offset)
  if arr.size != count:
    raise FormatError(f"{info.file}: truncated: tensor {info.name!r} could be read only partly.")
  return arr.reshape(info.shape)


def read_chunks(info: TensorInfo, max_bytes: int = 64 << 20) -> Iterable[np.ndarray]:
  """The tensor's values, flat, in pieces of at most `max_bytes` (a scan of a large tensor holds one piece)."""
  step = max(max_bytes // info.dtype.itemsize, 1)
  total = info.nbytes // info.dtype.itemsize
  for start in range(0, total, step):
    count = min(step, total - start)
    arr = np.fromfile(info.file, dtype=info.dtype, count=count, offset=info.offset + start * info.dtype.itemsize)
    if arr.size != count:
      raise FormatError(f"{info.file}: truncated: tensor {info.name!r} could be read only partly.")
    yield arr


def write(path: str, specs: Iterable[tuple[str, tuple[int, ...], np.dtype]], produce: Callable[[str], np.ndarray],
          metadata: dict[str, str] | None = None) -> int:
  """Writes a file of the tensors `specs` (name, shape, dtype) in order, calling `produce(name)` for each tensor's
  values just before writing it (cast to the spec's dtype). Returns the bytes written."""
  specs = [(name, tuple(int(d) for d in shape), np.dtype(dtype)) for name, shape, dtype in specs]
  header, offset = {}, 0
  if metadata:
    header["__metadata__"] = dict(metadata)
  for name, shape, dtype in specs:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the reference writer does
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for name, shape, dtype in specs:
      arr = np.ascontiguousarray(np.asarray(produce(name)).astype(dtype, copy=False))
      if arr.shape != shape:
        raise ValueError(f"{path}: tensor {name!r} has shape {arr.shape}, the header says {shape}.")
      f.write(arr.reshape(-1).view(np.uint8))
  os.replace(tmp, path)
  return 8 + len(raw) + offset
