"""The request's `Cache-Control` (RFC 9111 §5.2.1), reduced to the directives the gateway honours.

Parsing is tolerant (case-insensitive names, optional whitespace, token or quoted-string arguments, unknown
directives ignored) and, where the request is ambiguous, resolves towards the more restrictive reading
(RFC 9111 §4.2.1), so a garbled header can cost a cache hit but never serve what the client refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# RFC 9111 §1.2.2: a delta-seconds too large to represent is taken as 2^31.
MAX_DELTA_SECONDS: Final = 2**31
_DELTA_SECONDS: Final = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class RequestDirectives:
    no_cache: bool = False
    no_store: bool = False
    max_age_s: int | None = None
    only_if_cached: bool = False


NO_DIRECTIVES = RequestDirectives()  # a request without Cache-Control or Pragma


def parse_request_cache_control(value: str | None, pragma: str | None = None) -> RequestDirectives:
    """Directives of a `Cache-Control` field value (several field lines joined with ", ").

    `pragma` is the `Pragma` field value: its `no-cache` counts only when the request has no
    `Cache-Control` (RFC 7234 §5.4; RFC 9111 §5.4 deprecates Pragma but HTTP/1.0 clients still send it).
    """
    if value is None or not value.strip():
        return RequestDirectives(no_cache=_pragma_no_cache(pragma))
    no_cache = no_store = only_if_cached = False
    max_age_s: int | None = None
    for name, argument in _directives(value):
        match name:
            case "no-cache":  # RFC 9111 §5.2.1.4; an argument is not defined for requests: still no-cache
                no_cache = True
            case "no-store":  # RFC 9111 §5.2.1.5
                no_store = True
            case "only-if-cached":  # RFC 9111 §5.2.1.7
                only_if_cached = True
            case "max-age":  # RFC 9111 §5.2.1.1; repeated: the most restrictive wins (§4.2.1)
                seconds = _delta_seconds(argument)
                max_age_s = seconds if max_age_s is None else min(max_age_s, seconds)
            case _:  # RFC 9111 §5.2.3: unrecognized directives (and max-stale, min-fresh, ...) are ignored
                pass
    return RequestDirectives(
        no_cache=no_cache, no_store=no_store, max_age_s=max_age_s, only_if_cached=only_if_cached
    )


def _delta_seconds(argument: str | None) -> int:
    """RFC 9111 §1.2.2 delta-seconds. Invalid (missing, negative, fractional, text) reads as 0.

    RFC 9111 §4.2.1 encourages treating invalid freshness information as stale; for a request's
    max-age that is max-age=0: no stored answer is acceptable, the fresh one is still stored.
    """
    if argument is None or not _DELTA_SECONDS.fullmatch(argument):
        return 0
    return min(int(argument), MAX_DELTA_SECONDS)


def _pragma_no_cache(pragma: str | None) -> bool:
    return pragma is not None and any(name == "no-cache" for name, _ in _directives(pragma))


def _directives(value: str) -> list[tuple[str, str | None]]:
    """(lowercased name, unquoted argument or None) for each comma-separated element."""
    result = []
    for element in _split_list(value):
        name, eq, argument = element.partition("=")
        name = name.strip().lower()
        if name:
            result.append((name, _unquote(argument.strip()) if eq else None))
    return result


def _split_list(value: str) -> list[str]:
    """RFC 9110 §5.6.1 list elements: split on commas outside quoted strings."""
    elements: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in value:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            elements.append("".join(current))
            current = []
            continue
        current.append(ch)
    elements.append("".join(current))
    return elements


def _unquote(argument: str) -> str:
    """RFC 9110 §5.6.4 quoted-string; RFC 9111 §5.2: recipients accept both token and quoted forms."""
    if len(argument) < 2 or argument[0] != '"' or argument[-1] != '"':
        return argument
    return re.sub(r"\\(.)", r"\1", argument[1:-1])
