"""Akamai Fast Purge v3 by cache tag: `POST /ccu/v3/{invalidate|delete}/tag/{network}`, EdgeGrid-signed.

API reference: https://techdocs.akamai.com/purge-cache/reference/api (Invalidate by cache tag / Delete by
cache tag: body `{"objects": ["tag", ...]}`, success is 201 with `purgeId`, `estimatedSeconds`; 429 on rate
limits). Akamai recommends `invalidate` (serve stale while revalidating) over `delete`. Tags follow
https://techdocs.akamai.com/purge-cache/docs/purge-content-cache-tag (at most 128 characters; ':' and
other characters are disallowed, so tags are spelled as `cdn.tags.encode_tag(tag, "akamai")`, the same
spelling the gateway's Edge-Cache-Tag header used). The Fast Purge request body is limited to 50,000 bytes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Literal

import aiohttp

from cdn.purge.base import Batch, HttpPurgeClient, PurgeResult, batches_by_size, check_2xx, targets_for
from cdn.purge.edgegrid import DEFAULT_MAX_BODY, EdgeGridCredentials, edgegrid_timestamp, sign_request
from cdn.purge.redact import redacted_repr
from cdn.purge.retry import RetryPolicy, Sleep, Uniform
from cdn.purge.transport import AiohttpTransport, HttpRequest, HttpResponse, Transport

__all__ = ["AKAMAI_MAX_BODY_BYTES", "AkamaiConfig", "AkamaiPurgeClient"]

AKAMAI_MAX_BODY_BYTES = 50_000
_ENVELOPE_BYTES = len('{"objects": []}')


@dataclass(frozen=True, slots=True, repr=False)
class AkamaiConfig:
    host: str  # the credential's API host, e.g. akab-xxxx.purge.akamaiapis.net
    credentials: EdgeGridCredentials
    network: Literal["production", "staging"] = "production"
    operation: Literal["invalidate", "delete"] = "invalidate"
    base_url: str | None = None  # default https://{host}; tests point it at a local fake
    max_body_bytes: int = AKAMAI_MAX_BODY_BYTES
    signing_max_body: int = DEFAULT_MAX_BODY
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.host or "/" in self.host:
            raise ValueError("akamai: host must be a bare host name")
        if self.network not in ("production", "staging"):
            raise ValueError("akamai: network must be 'production' or 'staging'")
        if self.operation not in ("invalidate", "delete"):
            raise ValueError("akamai: operation must be 'invalidate' or 'delete'")
        if not 256 <= self.max_body_bytes <= AKAMAI_MAX_BODY_BYTES:
            raise ValueError(f"akamai: max_body_bytes must be in 256..{AKAMAI_MAX_BODY_BYTES}")

    @property
    def url_base(self) -> str:
        return (self.base_url or f"https://{self.host}").rstrip("/")

    def __repr__(self) -> str:
        return redacted_repr(self, [f.name for f in fields(self)], frozenset())


class AkamaiPurgeClient(HttpPurgeClient[AkamaiConfig]):
    name = "akamai"

    def __init__(
        self,
        config: AkamaiConfig,
        session: aiohttp.ClientSession,
        *,
        sleep: Sleep = asyncio.sleep,
        rng: Uniform | None = None,
        transport: Transport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        nonce: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        # Sign at send time: a retried request needs a fresh timestamp and nonce.
        signing = _SigningTransport(transport or AiohttpTransport(session), config, clock, nonce)
        super().__init__(config, session, sleep=sleep, rng=rng, transport=signing)

    def _secrets(self) -> Iterable[str | None]:
        creds = self._config.credentials
        return [creds.client_secret, creds.access_token, creds.client_token]

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        values, errors = targets_for(keys, tags, "akamai")
        cfg = self._config
        url = f"{cfg.url_base}/ccu/v3/{cfg.operation}/tag/{cfg.network}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        # Each object costs its JSON string (quotes included) plus ", ".
        budget = cfg.max_body_bytes - _ENVELOPE_BYTES
        batches = [
            Batch(HttpRequest("POST", url, headers, json.dumps({"objects": chunk}).encode()), len(chunk))
            for chunk in batches_by_size(values, max_count=len(values) or 1, max_bytes=budget, overhead=4)
        ]
        return await self._send(batches, check_2xx, errors)


class _SigningTransport:
    """Adds a fresh EdgeGrid `Authorization` header to each attempt, then delegates."""

    __slots__ = ("_clock", "_config", "_inner", "_nonce")

    def __init__(
        self, inner: Transport, config: AkamaiConfig, clock: Callable[[], datetime], nonce: Callable[[], str]
    ) -> None:
        self._inner = inner
        self._config = config
        self._clock = clock
        self._nonce = nonce

    async def send(self, request: HttpRequest, timeout_s: float) -> HttpResponse:
        auth = sign_request(
            request.method,
            request.url,
            request.body,
            self._config.credentials,
            edgegrid_timestamp(self._clock()),
            self._nonce(),
            max_body=self._config.signing_max_body,
        )
        signed = HttpRequest(
            request.method, request.url, {**request.headers, "Authorization": auth}, request.body
        )
        return await self._inner.send(signed, timeout_s)
