"""The purge interface shared by every CDN client, and the batch loop they all run.

A client turns `purge(keys, tags)` into provider requests: gateway keys become `key:{digest}` tags
(DESIGN §3), every tag is spelled as that CDN's tag header spelled it (`cdn.tags.encode_tag`), and the
list is cut into batches within the provider's documented per-request limit. Each batch is sent with
retries; a failure is recorded in the result and the remaining batches still go out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cdn.purge.retry import RetryingSender
from cdn.purge.transport import HttpRequest, HttpResponse
from cdn.tags import edge_tag_values, key_tag

__all__ = [
    "Batch",
    "PurgeClient",
    "PurgeResult",
    "batches_by_count",
    "batches_by_size",
    "body_snippet",
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
