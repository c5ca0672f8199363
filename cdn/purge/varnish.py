"""Varnish purge by xkey (hard or soft), or by ban, sent to every Varnish listener we front.

xkey (vmod_xkey from varnish-modules, https://github.com/varnish/varnish-modules/blob/master/src/vmod_xkey.vcc):
objects are indexed by the space-separated tags of their `xkey` response header; our VCL answers
`PURGE` requests carrying `xkey-purge: tag1 tag2` with `xkey.purge(...)` and `xkey-softpurge: ...` with
`xkey.softpurge(...)` (soft: objects become stale and can still be served within grace).

Ban alternative (https://varnish-cache.org/docs/trunk/users-guide/purging.html#bans): a `BAN` request
carrying `X-Ban-Tags: tag1 tag2`; the VCL turns each tag into `ban("obj.http.xkey ~ (^| )" + tag + "( |$)")`.
Bans need no vmod but are evaluated lazily against every object, so prefer xkey.

Contract with the VCL (cdn/README.md): method and header as above, optional `X-Purge-Token` checked by the
VCL (in addition to an ACL), 200 on success. A tag value never contains whitespace or a comma (see
`cdn.tags.encode_tag`). Batches keep each header under Varnish's default 8 KB request header line limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from cdn.purge.base import Batch, HttpPurgeClient, PurgeResult, batches_by_size, check_2xx, targets_for
from cdn.purge.redact import redacted_repr
from cdn.purge.retry import RetryPolicy
from cdn.purge.transport import HttpRequest

__all__ = ["VarnishConfig", "VarnishPurgeClient"]

_MAX_HEADER_BYTES = 7_168  # http_req_hdr_len defaults to 8k; leave room for the name and other headers


@dataclass(frozen=True, slots=True, repr=False)
class VarnishConfig:
    purge_urls: tuple[str, ...]  # one per Varnish listener, e.g. ("http://127.0.0.1:6081/",)
    token: str | None = None
    mode: Literal["xkey", "ban"] = "xkey"
    soft: bool = False
    max_header_bytes: int = _MAX_HEADER_BYTES
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.purge_urls:
            raise ValueError("varnish: at least one purge URL is required")
        for url in self.purge_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError("varnish: purge URLs must be http(s) URLs")
        if self.mode not in ("xkey", "ban"):
            raise ValueError("varnish: mode must be 'xkey' or 'ban'")
        if self.mode == "ban" and self.soft:
            raise ValueError("varnish: soft purge needs mode='xkey' (bans are always hard)")
        if not 256 <= self.max_header_bytes <= _MAX_HEADER_BYTES:
            raise ValueError(f"varnish: max_header_bytes must be in 256..{_MAX_HEADER_BYTES}")

    def __repr__(self) -> str:
        return redacted_repr(self, [f.name for f in fields(self)], frozenset({"token"}))


class VarnishPurgeClient(HttpPurgeClient[VarnishConfig]):
    name = "varnish"

    def _secrets(self) -> Iterable[str | None]:
        return [self._config.token]

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        values, errors = targets_for(keys, tags, "xkey")
        cfg = self._config
        if cfg.mode == "ban":
            method, header = "BAN", "X-Ban-Tags"
        else:
            method, header = "PURGE", "xkey-softpurge" if cfg.soft else "xkey-purge"
        chunks = list(batches_by_size(values, max_count=len(values) or 1, max_bytes=cfg.max_header_bytes))
        per_listener = await asyncio.gather(
            *(
                self._purge_listener(url, method, header, chunks, errors if i == 0 else [])
                for i, url in enumerate(cfg.purge_urls)
            )
        )
        # Every listener must drop the objects: a tag counts as purged only when all listeners accepted it.
        all_errors = tuple(e for r in per_listener for e in r.errors)
        return PurgeResult(
            cdn=self.name,
            ok=not all_errors,
            purged=min(r.purged for r in per_listener),
            requests=sum(r.requests for r in per_listener),
            errors=all_errors,
        )

    async def _purge_listener(
        self, url: str, method: str, header: str, chunks: Sequence[list[str]], errors: Sequence[str]
    ) -> PurgeResult:
        batches = []
        for chunk in chunks:
            headers = {header: " ".join(chunk)}
            if self._config.token:
                headers["X-Purge-Token"] = self._config.token
            batches.append(Batch(HttpRequest(method, url, headers), len(chunk)))
        return await self._send(batches, check_2xx, errors)
