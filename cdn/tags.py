r"""Per-CDN tag headers: which header each edge reads, how tags are spelled there, and how many fit.

The gateway calls `tag_headers` once per stored entry; the purge clients call `edge_tag_values` so that a
purge names a tag exactly as the response header spelled it. Both go through `encode_tag`, the single
place that decides a tag's on-the-wire form, so header and purge can never disagree. Entries keep their tags
as plain values (`model:my model`, from `gateway.keys.derive.entry_tags`); they are escaped here, once.

The alphabet per CDN (a byte outside it is sent as `%XX` of its UTF-8, and `%` itself is always escaped, so the
encoding is one-to-one and `model:my model` is `model:my%20model` everywhere):
- Fastly `Surrogate-Key`, Cloudflare `Cache-Tag`, Varnish `xkey`: visible ASCII (0x21-0x7E) except `,` `%` `"`
  `;` and `\` (list separators and quoting characters some edges or proxies treat specially).
- Akamai `Edge-Cache-Tag`: letters, digits and `!#$'+.^_`|~-` only (so `:` is `%3A`: `model%3Amy%20model`).

Order of importance (what survives truncation first): `key:` (the entry itself: exact purge by key is the
admin API's sharpest tool), `tenant:` (tenant-wide purge and data deletion must reach every entry), then
`model:`, `rev:` (coarse operator purges; a new revision already changes every key), then anything else in
the caller's order. Truncation keeps the longest prefix of that order that fits and drops whole tags from
the end; it never cuts a tag in half. A single tag longer than the CDN's per-tag limit is dropped alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import quote, unquote

__all__ = [
    "TAG_TARGETS",
    "TagHeaderSpec",
    "edge_tag_values",
    "encode_tag",
    "key_tag",
    "order_tags",
    "purge_tag_forms",
    "tag_headers",
]

# design §3: te1:{scope}:{digest}, digest = hex BLAKE2b-256. Any future key version maps the same way.
_KEY_RE = re.compile(r"^te\d+:[^:\s]+:([0-9a-f]{64})$")
_PRIORITY = ("key:", "tenant:", "model:", "rev:")

# Visible ASCII minus the list separators (",", whitespace), "%" (our escape character) and quoting characters.
_GENERIC_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ',%";\\')
# Akamai allows only RFC 7230 token characters and lists ":" "/" "@" "=" ... as disallowed:
# https://learn.akamai.com/en-us/webhelp/fast-purge/fast-purge/GUID-58874706-3157-4BEA-A1C6-6EE02600388D.html
# We keep the intersection of that table and https://techdocs.akamai.com/terraform/v6.2/reference/ga-cache-tag
# ("alphanumeric plus [!#$%'+./^_`|~-]", which disagrees about "/": we escape it).
_AKAMAI_SAFE = "!#$'+.^_`|~-"


@dataclass(frozen=True, slots=True)
class TagHeaderSpec:
    """One edge's tag header: its name, separator and documented limits (bytes of the header value)."""

    header: str
    separator: str
    max_value_bytes: int
    max_tag_bytes: int
    max_tags: int
    safe_chars: str
    docs: str

    def __post_init__(self) -> None:
        if self.max_value_bytes <= 0 or self.max_tag_bytes <= 0 or self.max_tags <= 0:
            raise ValueError("tag header limits must be positive")


_FASTLY_DOCS = "https://www.fastly.com/documentation/reference/http/http-headers/Surrogate-Key/"
_CLOUDFLARE_DOCS = "https://developers.cloudflare.com/cache/how-to/purge-cache/purge-by-tags/"
_VARNISH_DOCS = "https://varnish-cache.org/docs/trunk/reference/varnishd.html#http-resp-hdr-len"
_AKAMAI_DOCS = "https://techdocs.akamai.com/purge-cache/docs/assign-cache-tags"

# target -> (header, separator, max_value_bytes, max_tag_bytes, max_tags, safe_chars, docs)
TAG_TARGETS: Mapping[str, TagHeaderSpec] = MappingProxyType(
    {
        # Fastly: space-separated; header value up to 16 KB, each key up to 1 KB.
        "surrogate-key": TagHeaderSpec(
            "Surrogate-Key", " ", 16_384, 1_024, 16_384, _GENERIC_SAFE, _FASTLY_DOCS
        ),
        # Cloudflare: comma-separated; "the aggregate Cache-Tag HTTP header cannot exceed 16 KB after the header
        # field name", counting commas, "approximately 1,000 unique tags"; no per-tag maximum.
        "cache-tag": TagHeaderSpec("Cache-Tag", ",", 16_384, 16_384, 1_000, _GENERIC_SAFE, _CLOUDFLARE_DOCS),
        # Varnish xkey: space-separated. No documented xkey limit, but Varnish rejects a backend response header
        # line longer than http_resp_hdr_len (default 8 KB): keep well under it.
        "xkey": TagHeaderSpec("xkey", " ", 8_000, 8_000, 8_000, _GENERIC_SAFE, _VARNISH_DOCS),
        # Akamai: one Edge-Cache-Tag header, comma-separated, at most 128 tags of at most 128 characters, and the
        # default maximum size of all reply headers is 8192 bytes: we give the tags half of that.
        "akamai": TagHeaderSpec("Edge-Cache-Tag", ",", 4_096, 128, 128, _AKAMAI_SAFE, _AKAMAI_DOCS),
    }
)


def key_tag(key: str) -> str:
    """The tag that names one gateway entry: `te1:{scope}:{digest}` -> `key:{digest}` (design §3)."""
    match = _KEY_RE.match(key)
    if match is None:
        raise ValueError("not a tokenedge cache key (expected te1:{scope}:{64 hex digest})")
    return f"key:{match.group(1)}"


def order_tags(tags: Iterable[str]) -> list[str]:
    """Deduplicate (first occurrence wins) and sort by importance; stable within a class."""
    unique = list(dict.fromkeys(t for t in tags if t))

    def rank(tag: str) -> int:
        for i, prefix in enumerate(_PRIORITY):
            if tag.startswith(prefix):
                return i
        return len(_PRIORITY)

    return sorted(unique, key=rank)


def encode_tag(tag: str, target: str) -> str:
    """The tag as `target` sees it: bytes outside the CDN's allowed set are %-escaped (UTF-8), so the
    mapping is injective and header-safe. `key:ab` stays `key:ab` for Fastly, Cloudflare and xkey, and
    becomes `key%3Aab` for Akamai, which forbids ':'."""
    return quote(tag, safe=_spec(target).safe_chars)


def purge_tag_forms(tags: Iterable[str]) -> list[str]:
    """The tags a purge names, plus the plain value of any written as a header spells it (`model:my%20model`
    also purges `model:my model`). Purging one extra, similarly named tag is the safe side of the ambiguity."""
    forms = dict.fromkeys(tags)
    for tag in list(forms):
        if "%" in tag:
            forms.setdefault(unquote(tag))
    return list(forms)


def edge_tag_values(tags: Iterable[str], target: str) -> tuple[list[str], int]:
    """Ordered, encoded, deduplicated tags for `target`, minus those over its per-tag limit (counted)."""
    spec = _spec(target)
    values: list[str] = []
    dropped = 0
    for tag in order_tags(tags):
        encoded = encode_tag(tag, target)
        if len(encoded) > spec.max_tag_bytes:
            dropped += 1
        elif encoded not in values:
            values.append(encoded)
    return values, dropped


def tag_headers(tags: Sequence[str], targets: Iterable[str]) -> tuple[dict[str, str], int]:
    """Headers carrying `tags` for each target, and the number of tags dropped to fit, summed over targets.

    A target whose tags all drop (or an empty `tags`) gets no header. Unknown targets raise ValueError.
    """
    headers: dict[str, str] = {}
    truncated = 0
    for target in dict.fromkeys(targets):
        spec = _spec(target)
        values, dropped = edge_tag_values(tags, target)
        kept: list[str] = []
        size = 0
        for value in values:
            extra = len(value) + (len(spec.separator) if kept else 0)
            if len(kept) >= spec.max_tags or size + extra > spec.max_value_bytes:
                break
            kept.append(value)
            size += extra
        truncated += dropped + len(values) - len(kept)
        if kept:
            headers[spec.header] = spec.separator.join(kept)
    return headers, truncated


def _spec(target: str) -> TagHeaderSpec:
    try:
        return TAG_TARGETS[target]
    except KeyError:
        raise ValueError(f"unknown tag target {target!r}; expected one of {sorted(TAG_TARGETS)}") from None
