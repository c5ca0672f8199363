"""Measured row tilings kept on disk between starts, so a restart does not re-measure them (`calibrate_tiling`,
backend/model/tiling.py: 4-31 s for SmolLM2 on 2 shared cores, by their load, 18-63 s on the AMD EPYC CI
machine (bf16 and fp32); 0.0 s read back).

A tiling is evidence about the kernels torch and tokenedge pick, which depend on the shape, the dtype, the
kernel, the CPU, torch's build and the thread count, never on the weights' values (tiling.py). So a stored
tiling is reused only under the very same `TilingContext` (one file per context, named by its digest, the
context repeated inside and compared) and the same shape key. Every file carries FORMAT_VERSION: a file
that cannot be read, does not parse, holds another version or another context is a miss, and a miss only
means measuring again; the store never fails a start (a write that fails is logged and dropped).

    $TOKENEDGE_TILING_CACHE, else ~/.cache/tokenedge/tilings: tilings-<context digest>.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.kernels.build import source_hash
from backend.model import tiling
from backend.model.tiling import RowTiling, TilingMemo
from backend.runtime import cpu_flags, cpu_model

_LOG = logging.getLogger(__name__)
ENV = "TOKENEDGE_TILING_CACHE"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class TilingContext:
    """What a measured tiling depends on besides its shape key: the CPU's flags and model, the device, torch's
    version, tokenedge's int4 kernel (a hash of its source), the calibration itself (a hash of tiling.py:
    its candidates, trials and rule) and torch's intra-op thread count (the column split)."""

    cpu_flags: tuple[str, ...]
    cpu_model: str
    device: str
    torch_version: str
    kernel: str
    calibration: str
    threads: int

    @classmethod
    def current(cls, device: torch.device | str) -> TilingContext:
        """This process, now: read after the thread count is set (backend.__main__ sets it first)."""
        dev = torch.device(device)
        return cls(
            cpu_flags=tuple(sorted(cpu_flags())),
            cpu_model=cpu_model(),
            device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
            torch_version=torch.__version__,
            kernel=source_hash(),
            calibration=hashlib.blake2b(Path(tiling.__file__).read_bytes(), digest_size=8).hexdigest(),
            threads=torch.get_num_threads(),
        )

    def digest(self) -> str:
        """A name for this context's file: a hash of its canonical JSON (sorted keys, fixed separators)."""
        canonical = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(canonical.encode(), digest_size=10).hexdigest()


def encode(context: TilingContext, memo: TilingMemo) -> str:
    """The stored form of `memo` under `context`: versioned JSON, entries in a fixed order."""
    entries = [
        {"out": out, "in": inp, "kind": kind, "tile_rows": t.tile_rows, "min_rows": t.min_rows}
        for (out, inp, kind), t in sorted(memo.items())
    ]
    doc = {"version": FORMAT_VERSION, "context": dataclasses.asdict(context), "tilings": entries}
    return json.dumps(doc, sort_keys=True, indent=1)


def decode(text: str, context: TilingContext) -> TilingMemo | str:
    """The tilings stored in `text` for `context`, or why there are none (a miss, never an exception)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return f"not JSON ({exc})"
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        return f"format version {version!r}, this backend reads {FORMAT_VERSION}"
    if doc.get("context") != _as_json(dataclasses.asdict(context)):
        return "measured under another context"
    try:
        return {_entry_key(e): RowTiling(int(e["tile_rows"]), int(e["min_rows"])) for e in doc["tilings"]}
    except (KeyError, TypeError, ValueError) as exc:  # RowTiling refuses impossible tiles with ValueError
        return f"malformed entries ({exc!r})"


class TilingStore:
    """The tilings measured under one context, in one file under `root` (see the module docstring)."""

    def __init__(self, root: Path, context: TilingContext) -> None:
        self.root = root
        self.context = context
        self.path = root / f"tilings-{context.digest()}.json"

    @classmethod
    def default(cls, device: torch.device | str) -> TilingStore:
        """$TOKENEDGE_TILING_CACHE, else ~/.cache/tokenedge/tilings, for this process's context."""
        configured = os.environ.get(ENV)
        root = Path(configured) if configured else Path.home() / ".cache" / "tokenedge" / "tilings"
        return cls(root, TilingContext.current(device))

    def load(self) -> TilingMemo:
        """The stored tilings, or none (logged with the reason) where the file is missing or unusable."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            _LOG.warning("row tiling cache %s unreadable (%s): measuring", self.path, exc)
            return {}
        found = decode(text, self.context)
        if isinstance(found, str):
            _LOG.warning("row tiling cache %s not used (%s): measuring", self.path, found)
            return {}
        return found

    def save(self, memo: TilingMemo) -> None:
        """Replace the file with `memo`, atomically (a concurrent start reads the old file or the new, whole);
        a failure costs the next start a measurement, so it is logged, not raised."""
        partial: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.root, suffix=".tmp", delete=False) as tmp:
                partial = Path(tmp.name)
                tmp.write(encode(self.context, memo))
            os.replace(partial, self.path)
        except OSError as exc:
            _LOG.warning("row tiling cache %s not written (%s)", self.path, exc)
            if partial is not None:
                partial.unlink(missing_ok=True)


def _entry_key(entry: dict[str, Any]) -> tuple[int, int, str]:
    kind = entry["kind"]
    if not isinstance(kind, str):
        raise TypeError(f"kind {kind!r}")
    return int(entry["out"]), int(entry["in"]), kind


def _as_json(value: dict[str, Any]) -> Any:
    """`value` as it reads back from JSON (tuples become lists), to compare with a stored context."""
    return json.loads(json.dumps(value))
