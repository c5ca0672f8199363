"""Fastly purge by surrogate key: `POST /service/{service_id}/purge`, keys in a `Surrogate-Key` header.

API reference: https://www.fastly.com/documentation/reference/api/purging/ ("Purge multiple surrogate key
tags": up to 256 keys per request, listed space-separated in a `Surrogate-Key` request header as an
alternative to a JSON body; `Fastly-Key` carries the API token; `Fastly-Soft-Purge: 1` marks content stale
instead of evicting it). A success is HTTP 200 with a JSON map of key -> purge id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

from cdn.purge.base import Batch, HttpPurgeClient, PurgeResult, batches_by_count, check_2xx, targets_for
from cdn.purge.redact import redacted_repr
from cdn.purge.retry import RetryPolicy
from cdn.purge.transport import HttpRequest

__all__ = ["FASTLY_MAX_KEYS_PER_REQUEST", "FastlyConfig", "FastlyPurgeClient"]

FASTLY_MAX_KEYS_PER_REQUEST = 256


@dataclass(frozen=True, slots=True, repr=False)
class FastlyConfig:
    api_token: str
    service_id: str
    base_url: str = "https://api.fastly.com"
    soft: bool = False
    max_keys_per_request: int = FASTLY_MAX_KEYS_PER_REQUEST
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.api_token or not self.service_id:
            raise ValueError("fastly: api_token and service_id are required")
        if "/" in self.service_id:
            raise ValueError("fastly: service_id must not contain '/'")
        if not 1 <= self.max_keys_per_request <= FASTLY_MAX_KEYS_PER_REQUEST:
            raise ValueError(f"fastly: max_keys_per_request must be in 1..{FASTLY_MAX_KEYS_PER_REQUEST}")

    def __repr__(self) -> str:
        return redacted_repr(self, [f.name for f in fields(self)], frozenset({"api_token"}))


class FastlyPurgeClient(HttpPurgeClient[FastlyConfig]):
    name = "fastly"

    def _secrets(self) -> Iterable[str | None]:
        return [self._config.api_token]

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        values, errors = targets_for(keys, tags, "surrogate-key")
        cfg = self._config
        url = f"{cfg.base_url.rstrip('/')}/service/{cfg.service_id}/purge"
        batches = []
        for chunk in batches_by_count(values, cfg.max_keys_per_request):
            headers = {
                "Fastly-Key": cfg.api_token,
                "Accept": "application/json",
                "Surrogate-Key": " ".join(chunk),
            }
            if cfg.soft:
                headers["Fastly-Soft-Purge"] = "1"
            batches.append(Batch(HttpRequest("POST", url, headers), len(chunk)))
        return await self._send(batches, check_2xx, errors)
