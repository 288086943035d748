"""A safetensors file's head read within bounds: its length, its JSON header, every tensor's dtype, shape and
byte range, all checked against the file before one tensor byte is read.

The format is 8 bytes of header length (little-endian), a JSON object, then the tensors' bytes. A file from
elsewhere may declare anything there: a header of 2^63 bytes, JSON nested thousands deep, a tensor whose shape
holds 10^12 elements in a file of a few kilobytes, byte ranges past the end or over each other. Each is refused
here, in one line naming the file, from the header alone; nothing is allocated from a declared size. A file that
passes holds exactly the bytes its header declares, so a reader that loads a tensor from it allocates no more than
the file holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..common import loads_outside
from ..errors import WorkbenchError

MAX_HEADER = 100_000_000  # bytes: the safetensors library's own limit on a header
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte range in the data after the header
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHead:
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    header_bytes: int  # the JSON's length: the data starts 8 bytes after it
    data_bytes: int


def _entry(name: str, value: object, data_bytes: int, what: str) -> TensorEntry:
    if not isinstance(value, dict) or set(value) - {"dtype", "shape", "data_offsets"}:
        raise WorkbenchError(f"{what}: tensor {name[:120]!r} is not a dtype, shape and data_offsets")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise WorkbenchError(f"{what}: tensor {name[:120]!r} has dtype {str(dtype)[:40]!r}, not one of "
                             f"{', '.join(DTYPE_BYTES)}")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(type(d) is int and 0 <= d for d in shape)):
        raise WorkbenchError(f"{what}: tensor {name[:120]!r} has shape {str(shape)[:80]}, not a list of at most 8 "
                             "sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
        raise WorkbenchError(f"{what}: tensor {name[:120]!r} lies at bytes {str(offsets)[:80]}, outside the "
                             f"{data_bytes:,} bytes of data the file holds")
    declared = math.prod(shape) * DTYPE_BYTES[dtype]  # Python ints: a shape of 10^12 elements does not overflow
    if declared != offsets[1] - offsets[0]:
        raise WorkbenchError(f"{what}: tensor {name[:120]!r} declares shape {tuple(shape)} of {dtype} "
                             f"({declared:,} bytes) but holds {offsets[1] - offsets[0]:,} bytes")
    return TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])


def _metadata(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise WorkbenchError(f"{what}: its __metadata__ is not a map of text to text")
    return value


def read_safetensors_head(path: str | Path, what: str | None = None,
                          max_header: int = MAX_HEADER) -> SafetensorsHead:
    """The head of the safetensors file ``path``, checked (see the module's note), or a one-line WorkbenchError
    starting with ``what`` (default: the path)."""
    path = Path(path)
    what = what or str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or not 2 <= length <= min(max_header, size - 8):
                raise WorkbenchError(f"{what}: not a safetensors file (a header of {length:,} bytes in a file of "
                                     f"{size:,}; the limit is {max_header:,})")
            raw = f.read(length)
    except OSError as e:
        raise WorkbenchError(f"{what}: cannot be read ({e.strerror or type(e).__name__})") from None
    header = loads_outside(raw, f"{what}: its safetensors header", max_bytes=max_header)
    if not isinstance(header, dict):
        raise WorkbenchError(f"{what}: its safetensors header is a JSON {type(header).__name__}, not an object")
    data_bytes = size - 8 - length
    metadata = _metadata(header.pop("__metadata__", None), what)
    tensors = {name: _entry(name, value, data_bytes, what) for name, value in header.items()}
    ranges = sorted((t.start, t.end, name) for name, t in tensors.items() if t.nbytes)
    for (_, end, first), (start, _, second) in zip(ranges, ranges[1:]):
        if start < end:
            raise WorkbenchError(f"{what}: tensors {first[:80]!r} and {second[:80]!r} share bytes")
    return SafetensorsHead(tensors, metadata, length, data_bytes)
