"""Backend configuration: one tree, read once from defaults, then `TOKENEDGE_BACKEND_*` environment variables,
then command-line flags (each later source wins), and passed explicitly.

`BackendConfig` holds what the loader and the HTTP server need; its `engine` section is the `EngineConfig` the
engine runs with (backend/engine/config.py, the one home of the engine's fields and defaults, e.g.
`max_model_len` = 4096). Flags and variables stay flat, one per field of either: `--block-size`,
`TOKENEDGE_BACKEND_MAX_MODEL_LEN`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.engine.config import EngineConfig

ENV_PREFIX = "TOKENEDGE_BACKEND_"
_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}
_WEIGHTS = ("quantized", "dequantized")
_BOOLS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """`model=None` serves the default SmolLM2 GGUF. Weights use `dtype`; the residual stream and logits
    stay fp32 whatever it is. `threads=0` leaves torch's own default. `weights`: `quantized` (CPU only: the
    file's 4-bit blocks on the int4 kernel, other layers int8 per channel, a greedy-exact int8 LM head) or
    `dequantized` (the reference: every weight dequantized to `dtype`; other devices always use it).
    `engine`: device, pool, batching, `batch_invariant` (docs/design.md §8) and `speculative_tokens`."""

    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "bfloat16"
    weights: str = "quantized"
    threads: int = 0
    max_n: int = 4
    default_max_tokens: int = 256
    retry_after_s: int = 1
    max_stored_responses: int = 1024  # /v1/responses `store`: an LRU bounded by count and by bytes
    max_stored_response_bytes: int = 64 * 1024 * 1024
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.weights not in _WEIGHTS:
            raise ValueError(f"weights must be one of {_WEIGHTS}, got {self.weights!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        for name in (
            "max_n",
            "default_max_tokens",
            "retry_after_s",
            "max_stored_responses",
            "max_stored_response_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise ValueError("threads must be >= 0")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @classmethod
    def from_sources(
        cls, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> BackendConfig:
        env = os.environ if environ is None else environ
        fields = _flat_fields()
        values: dict[str, Any] = {}
        for name, spec in fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = _coerce(spec.type, raw, name)
        parser = argparse.ArgumentParser(prog="tokenedge-backend", description="tokenedge model server")
        for name, spec in fields.items():
            parser.add_argument(
                "--" + name.replace("_", "-"),
                dest=name,
                default=None,
                help=f"(env {ENV_PREFIX}{name.upper()}, default {spec.default!r})",
            )
        args = parser.parse_args(argv)
        for name, spec in fields.items():
            raw = getattr(args, name)
            if raw is not None:
                values[name] = _coerce(spec.type, raw, name)
        engine = {k: v for k, v in values.items() if k in _ENGINE_FIELDS}
        own = {k: v for k, v in values.items() if k not in _ENGINE_FIELDS}
        return cls(**own, engine=EngineConfig(**engine))


_ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig))


def _flat_fields() -> dict[str, dataclasses.Field[Any]]:
    """Every setting by its flat name: BackendConfig's own fields, then the engine section's."""
    own = {f.name: f for f in dataclasses.fields(BackendConfig) if f.name != "engine"}
    return {**own, **{f.name: f for f in dataclasses.fields(EngineConfig)}}


def _coerce(annotation: Any, raw: str, name: str) -> Any:
    kind = str(annotation)
    if kind == "bool":
        flag = raw.strip().lower()
        if flag not in _BOOLS:
            raise ValueError(f"{name}: expected true or false, got {raw!r}")
        return _BOOLS[flag]
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {raw!r}") from None
    if "None" in kind and raw.lower() in ("", "none", "default"):
        return None
    return raw
