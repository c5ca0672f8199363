"""Cloudflare purge by cache tag: `POST /client/v4/zones/{zone_id}/purge_cache` with `{"tags": [...]}`.

API reference: https://developers.cloudflare.com/api/go/resources/cache/methods/purge (body `{"tags": [...]}`,
`Authorization: Bearer <API token>`, a JSON envelope `{"success": bool, "errors": [{"code", "message"}],
"messages": [], "result": {"id"}}`). Limits: https://developers.cloudflare.com/cache/how-to/purge-cache/
("Max operations per request: 100" on every plan; purge requests are rate limited per account, so batches
go out one after another). A 200 whose envelope says `"success": false` is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

from cdn.purge.base import Batch, HttpPurgeClient, PurgeResult, batches_by_count, body_snippet, targets_for
from cdn.purge.redact import redacted_repr
from cdn.purge.retry import RetryPolicy
from cdn.purge.transport import HttpRequest, HttpResponse

__all__ = ["CLOUDFLARE_MAX_TAGS_PER_REQUEST", "CloudflareConfig", "CloudflarePurgeClient"]

CLOUDFLARE_MAX_TAGS_PER_REQUEST = 100


@dataclass(frozen=True, slots=True, repr=False)
class CloudflareConfig:
    api_token: str
    zone_id: str
    base_url: str = "https://api.cloudflare.com"
    max_tags_per_request: int = CLOUDFLARE_MAX_TAGS_PER_REQUEST
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.api_token or not self.zone_id:
            raise ValueError("cloudflare: api_token and zone_id are required")
        if "/" in self.zone_id:
            raise ValueError("cloudflare: zone_id must not contain '/'")
        if not 1 <= self.max_tags_per_request <= CLOUDFLARE_MAX_TAGS_PER_REQUEST:
            raise ValueError(
                f"cloudflare: max_tags_per_request must be in 1..{CLOUDFLARE_MAX_TAGS_PER_REQUEST}"
            )

    def __repr__(self) -> str:
        return redacted_repr(self, [f.name for f in fields(self)], frozenset({"api_token"}))


class CloudflarePurgeClient(HttpPurgeClient[CloudflareConfig]):
    name = "cloudflare"

    def _secrets(self) -> Iterable[str | None]:
        return [self._config.api_token]

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        values, errors = targets_for(keys, tags, "cache-tag")
        cfg = self._config
        url = f"{cfg.base_url.rstrip('/')}/client/v4/zones/{cfg.zone_id}/purge_cache"
        headers = {"Authorization": f"Bearer {cfg.api_token}", "Content-Type": "application/json"}
        batches = [
            Batch(HttpRequest("POST", url, headers, json.dumps({"tags": chunk}).encode()), len(chunk))
            for chunk in batches_by_count(values, cfg.max_tags_per_request)
        ]
        return await self._send(batches, _check, errors)


def _check(response: HttpResponse) -> str | None:
    try:
        envelope = json.loads(response.body)
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        return f"HTTP {response.status}: not a Cloudflare API envelope: {body_snippet(response)}"
    if 200 <= response.status < 300 and envelope.get("success") is True:
        return None
    details = []
    for err in envelope.get("errors") or []:
        if isinstance(err, dict):
            details.append(f"{err.get('code')}: {err.get('message')}")
    return f"HTTP {response.status}: success=false: {'; '.join(details) or body_snippet(response)}"
