"""Model revision: a content hash of the weight files plus the config, so any change to either changes
the id the gateway folds into its cache keys (design §3). The served revision adds how the weights are
computed (`numerics`: device, dtype, weight mode, int4 kernel): the same file served another way answers
differently in its last bits, so a cached answer of one must never stand for the other."""

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


def served_revision(revision: str, numerics: str) -> str:
    """The revision a server announces: the checkpoint's, made distinct per `numerics` (e.g. 'cpu bfloat16
    quantized int4-amx'). The reference mode's is the same for every server of it."""
    h = hashlib.blake2b(digest_size=12)
    h.update(revision.encode() + b"\0" + numerics.encode())
    return "rev-" + h.hexdigest()
