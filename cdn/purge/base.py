"""The purge interface shared by every CDN client, the batch loop they all run, and their common plumbing.

A client turns `purge(keys, tags)` into provider requests: gateway keys become `key:{digest}` tags
(design §3), every tag is spelled as that CDN's tag header spelled it (`cdn.tags.encode_tag`), and the
list is cut into batches within the provider's documented per-request limit. Each batch is sent with
retries; a failure is recorded in the result and the remaining batches still go out. `HttpPurgeClient`
holds what every provider shares (constructor, redactor, retrying sender, repr, 2xx check), so each
provider's file holds only its own request shape.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

import aiohttp

from cdn.purge.redact import Redactor
from cdn.purge.retry import RetryingSender, RetryPolicy, Sleep, Uniform
from cdn.purge.transport import AiohttpTransport, HttpRequest, HttpResponse, Transport
from cdn.tags import edge_tag_values, key_tag

__all__ = [
    "Batch",
    "HttpPurgeClient",
    "PurgeClient",
    "PurgeResult",
    "batches_by_count",
    "batches_by_size",
    "body_snippet",
    "check_2xx",
    "run_batches",
    "targets_for",
]


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What one CDN did with one purge call.

    `purged`: tags (key tags included) in batches the CDN accepted. `requests`: HTTP requests sent,
    retries included. `errors`: redacted, human-readable; `ok` is True only when there are none.
    """

    cdn: str
    ok: bool
    purged: int
    requests: int
    errors: tuple[str, ...] = ()


@runtime_checkable
class PurgeClient(Protocol):
    name: str

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult: ...


@dataclass(frozen=True, slots=True)
class Batch:
    request: HttpRequest
    size: int  # tags this request purges


# Returns None when the response means success, else a short (unredacted) reason.
ResponseCheck = Callable[[HttpResponse], str | None]


def targets_for(keys: Sequence[str], tags: Sequence[str], target: str) -> tuple[list[str], list[str]]:
    """Encoded tag values to purge on `target`, and the errors for keys/tags that cannot be purged there."""
    errors: list[str] = []
    names: list[str] = []
    for key in keys:
        try:
            names.append(key_tag(key))
        except ValueError as exc:
            errors.append(f"key {key[:80]!r}: {exc}")
    names.extend(tags)
    values, dropped = edge_tag_values(names, target)
    if dropped:
        errors.append(f"{dropped} tag(s) exceed the per-tag limit of {target} and were not purged")
    return values, errors


def batches_by_count(values: Sequence[str], max_count: int) -> Iterator[list[str]]:
    for start in range(0, len(values), max_count):
        yield list(values[start : start + max_count])


def batches_by_size(
    values: Sequence[str], max_count: int, max_bytes: int, overhead: int = 1
) -> Iterator[list[str]]:
    """Greedy batches of at most `max_count` values whose sizes (plus `overhead` each) fit `max_bytes`."""
    batch: list[str] = []
    size = 0
    for value in values:
        cost = len(value.encode()) + overhead
        if batch and (len(batch) >= max_count or size + cost > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(value)
        size += cost
    if batch:
        yield batch


async def run_batches(
    cdn: str,
    batches: Sequence[Batch],
    sender: RetryingSender,
    check: ResponseCheck,
    redact: Callable[[str], str],
    errors: Sequence[str] = (),
) -> PurgeResult:
    """Send every batch (sequentially: providers rate-limit per account), collecting one result."""
    all_errors = [redact(e) for e in errors]
    purged = 0
    requests = 0
    for batch in batches:
        outcome = await sender.send(batch.request)
        requests += outcome.attempts
        if outcome.error is not None:
            all_errors.append(outcome.error)
            continue
        assert outcome.response is not None  # no error means a response came back
        reason = check(outcome.response)
        if reason is None:
            purged += batch.size
        else:
            all_errors.append(redact(f"{batch.request.method} {batch.request.url}: {reason}"))
    return PurgeResult(cdn=cdn, ok=not all_errors, purged=purged, requests=requests, errors=tuple(all_errors))


def body_snippet(response: HttpResponse, limit: int = 300) -> str:
    text = response.body[:limit].decode("utf-8", "replace")
    return " ".join(text.split())


def check_2xx(response: HttpResponse) -> str | None:
    """Success is any 2xx; otherwise the status and the start of the body, where providers put the reason."""
    if 200 <= response.status < 300:
        return None
    return f"HTTP {response.status}: {body_snippet(response)}"


class _RetryConfig(Protocol):
    @property
    def retry(self) -> RetryPolicy: ...


ConfigT = TypeVar("ConfigT", bound=_RetryConfig)


class HttpPurgeClient(ABC, Generic[ConfigT]):
    """The plumbing every provider's `PurgeClient` shares, written once so the providers cannot drift.

    The constructor is the one the gateway and tests call. The redactor is built from the provider's
    secrets before any request exists, and the same redactor is handed to the sender, so every error and
    log line is scrubbed by one object. The sender goes through the injected transport (tests) or one over
    the caller's session. The repr shows only the config, whose own repr redacts credentials.
    """

    name: str

    def __init__(
        self,
        config: ConfigT,
        session: aiohttp.ClientSession,
        *,
        sleep: Sleep = asyncio.sleep,
        rng: Uniform | None = None,
        transport: Transport | None = None,
    ) -> None:
        self._config = config
        self._redact = Redactor(self._secrets())
        self._sender = RetryingSender(
            self.name,
            transport or AiohttpTransport(session),
            config.retry,
            self._redact,
            sleep=sleep,
            rng=rng,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._config!r})"

    @abstractmethod
    def _secrets(self) -> Iterable[str | None]:
        """Every credential in `self._config`: each is hidden in the errors and logs this client produces."""

    @abstractmethod
    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        """Purge `keys` (as `key:` tags) and `tags` on this CDN; never raises for HTTP failures."""

    async def _send(
        self, batches: Sequence[Batch], check: ResponseCheck, errors: Sequence[str] = ()
    ) -> PurgeResult:
        """`run_batches` with this client's name, sender and redactor."""
        return await run_batches(self.name, batches, self._sender, check, self._redact, errors)
