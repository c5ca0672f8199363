"""Request-path normalization, done once per request before anything routes or forwards it (pure functions).

An attacker's path reaches three parsers that disagree: aiohttp's router (percent-decoded, dot segments kept), the
upstream client (yarl resolves `..` when it joins the base URL) and whatever the upstream runs. The gateway therefore
accepts a path only when it is already in normal form, so every parser reads the same thing:

- the request target is origin-form (`/...`) or absolute-form (`http://host/...`; its path is checked the same way);
- each segment is percent-decoded exactly once (invalid escapes are refused);
- no segment, raw or decoded, is empty (`//`), `.` or `..`, or holds `/`, `\\`, `;`, `%` (a double encoding),
  or a control character: encoded separators, backslashes, matrix parameters and dot segments are refused;
- one exception: the id segment of an OpenAI resource (`/v1/models/{id}`, `/v1/files/{id}/...`; `ID_COLLECTIONS`)
  may hold an encoded `/` (`%2F`), because vLLM serves `org/name` model ids and the SDKs send
  `models.retrieve("org/name")` as `/v1/models/org%2Fname`. The id is decoded once, and each part its slashes
  separate is held to the rules of a segment (not empty, `.` or `..`), so `%2F..%2F` is refused as `/../` is;
  `\\`, `;` and `%` (so `%252F`) stay refused there too. The segment is forwarded as sent, still encoded, which is
  what OpenAI and the co-deployed backend (`/v1/models/{model:.+}`) expect;
- a trailing slash is allowed (an empty last segment) so `/` itself is valid.

A refused path is a 400 and is never forwarded; `escapes_v1` tells the caller when the path, resolved the way a
lenient parser would, would have left `/v1/`, which is named in the message. The query string is not the path's
business: it is relayed as sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

_FORBIDDEN_DECODED = frozenset("/\\;%")
_FORBIDDEN_IN_ID = frozenset("\\;%")  # an id segment may hold a decoded '/', nothing else more
# The collections under /v1/ whose next segment is a resource id (the OpenAI API's `{id}` path parameters).
ID_COLLECTIONS: frozenset[tuple[str, ...]] = frozenset(
    {
        ("v1", "models"),
        ("v1", "files"),
        ("v1", "batches"),
        ("v1", "uploads"),
        ("v1", "responses"),
        ("v1", "chat", "completions"),
    }
)
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class PathRefusal:
    """Why a path was refused; `escapes_v1` when resolving it leniently would leave `/v1/`."""

    reason: str
    escapes_v1: bool = False


def origin_path(target: str) -> str:
    """The path part of a request target: origin-form as is, absolute-form without scheme and authority."""
    path = target.partition("?")[0].partition("#")[0]
    if path.startswith("/"):
        return path
    scheme, sep, rest = path.partition("://")
    if not sep or not scheme.isalpha():
        return path
    slash = rest.find("/")
    return "/" if slash < 0 else rest[slash:]


def check_path(raw_path: str) -> PathRefusal | None:
    """None when `raw_path` (undecoded, no query) is in normal form; otherwise why it is refused."""
    if not raw_path.startswith("/"):
        return PathRefusal("the request path must start with '/'")
    segments = raw_path[1:].split("/")
    for index, raw in enumerate(segments):
        if raw == "":
            if index == len(segments) - 1:
                continue  # a trailing slash
            return PathRefusal("empty path segments ('//') are not accepted", _escapes_v1(raw_path))
        refusal = _check_segment(raw, is_id=tuple(segments[:index]) in ID_COLLECTIONS)
        if refusal is not None:
            return PathRefusal(refusal, _escapes_v1(raw_path))
    return None


def _check_segment(raw: str, *, is_id: bool = False) -> str | None:
    if "\\" in raw:
        return "backslashes are not accepted in the request path"
    if ";" in raw:
        return "';' parameters are not accepted in the request path"
    if any(ch < " " or ch == "\x7f" for ch in raw):
        return "control characters are not accepted in the request path"
    decoded = _decode_once(raw)
    if decoded is None:
        return "the request path holds an invalid percent-encoding"
    if decoded in (".", ".."):
        return "dot segments ('.', '..') are not accepted in the request path, encoded or not"
    if is_id and "/" in decoded:
        return _check_id(decoded)
    if not _FORBIDDEN_DECODED.isdisjoint(decoded):
        return "encoded separators ('%2F', '%5C', '%3B') and double encodings ('%25') are not accepted"
    if any(ch < " " or ch == "\x7f" for ch in decoded):
        return "control characters are not accepted in the request path"
    return None


def _check_id(decoded: str) -> str | None:
    """A decoded id with slashes (`org/name`): each part must pass as a segment would, so no traversal reopens."""
    if not _FORBIDDEN_IN_ID.isdisjoint(decoded):
        return "encoded separators ('%5C', '%3B') and double encodings ('%25') are not accepted"
    if any(ch < " " or ch == "\x7f" for ch in decoded):
        return "control characters are not accepted in the request path"
    if any(part in ("", ".", "..") for part in decoded.split("/")):
        return "an id's encoded '/' must separate names: empty and dot parts ('%2F..%2F') are not accepted"
    return None


def _decode_once(raw: str) -> str | None:
    """Percent-decode one segment strictly: every `%` starts two hex digits and the bytes are UTF-8."""
    at = raw.find("%")
    while at >= 0:
        if len(raw) < at + 3 or raw[at + 1] not in _HEX or raw[at + 2] not in _HEX:
            return None
        at = raw.find("%", at + 3)
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _escapes_v1(raw_path: str) -> bool:
    """Would a lenient parser (decoding repeatedly, `\\` as `/`, dropping `;` params) resolve it outside `/v1/`?"""
    if not raw_path.startswith("/v1/"):
        return False
    text = raw_path
    for _ in range(4):  # double and triple encodings
        decoded = unquote_to_bytes(text).decode("utf-8", "replace")
        if decoded == text:
            break
        text = decoded
    stack: list[str] = []
    for segment in text.replace("\\", "/").split("/"):
        segment = segment.partition(";")[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if not stack:
                return True
            stack.pop()
            continue
        stack.append(segment)
    return not stack or stack[0] != "v1"
