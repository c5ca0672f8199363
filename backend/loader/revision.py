"""Model revision: a content hash of the weight files plus the config, so any change to either changes
the id the gateway folds into its cache keys (DESIGN §3)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from backend.model.config import LlamaConfig

_CHUNK_BYTES = 1 << 20


def model_revision(files: Iterable[Path], config: LlamaConfig) -> str:
    h = hashlib.blake2b(digest_size=12)
    for path in sorted(files, key=lambda p: p.name):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                h.update(chunk)
    h.update(repr(sorted(asdict(config).items())).encode())
    return "rev-" + h.hexdigest()
