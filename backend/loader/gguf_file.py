"""A GGUF file's metadata and tensor table, read in one pass (`read_gguf`), its tensors as views of a memory map.

Why not `gguf.GGUFReader`: it builds a numpy view for every part of every field, 147k of them for SmolLM2's
vocabulary and merges, which took 3 s of a start (this reads the same file in about 0.1 s). The values are
what `GGUFReader`'s `field.contents()` and `tensor.data` give (tests/backend/test_gguf.py compares the two on
SmolLM2's file): scalars as Python numbers, strings as `str`, arrays as lists; a tensor's data as its rows
(float32 / float16 elements, or the bytes of its quantized blocks), shaped outermost dimension first.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3, little-endian).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

_MAGIC = b"GGUF"
# value type -> struct format of a scalar (gguf.GGUFValueType numbering); 8 = string, 9 = array
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_PLAIN = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: innermost dimension first
    tensor_type: gguf.GGMLQuantizationType
    data: np.ndarray  # rows, outermost first: elements for F32/F16, block bytes for quantized types


@dataclass(frozen=True, slots=True)
class GGUFFile:
    metadata: dict[str, Any]  # key -> value, GGUF's own keys ('GGUF.*') left out
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            return [self.value(item) for _ in range(count)]
        return self.scalar(_SCALARS[kind])


def read_gguf(path: Path) -> GGUFFile:
    """The metadata and tensors of a GGUF file (version 2 or 3); ValueError for anything else."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(data.data)  # the map as a memoryview
    if bytes(cur.buf[:4]) != _MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}, expected 2 or 3")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
        infos.append((name, dims, gguf.GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-cur.pos // alignment) * alignment
    tensors = [_tensor(data, start, *info) for info in infos]
    return GGUFFile({k: v for k, v in metadata.items() if not k.startswith("GGUF.")}, tensors)


def _tensor(
    data: np.ndarray,
    start: int,
    name: str,
    dims: tuple[int, ...],
    kind: gguf.GGMLQuantizationType,
    offset: int,
) -> GGUFTensor:
    rows = tuple(reversed(dims))  # outermost first
    count = int(np.prod(dims))
    plain = _PLAIN.get(kind)
    if plain is not None:
        size = count * np.dtype(plain).itemsize
        array = data[start + offset : start + offset + size].view(plain).reshape(rows)
    else:
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        size = count // block * block_bytes
        array = data[start + offset : start + offset + size].reshape(
            *rows[:-1], rows[-1] // block * block_bytes
        )
    return GGUFTensor(name, dims, kind, array)
