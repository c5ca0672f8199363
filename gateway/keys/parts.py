"""The request table: every part of a request the upstream can see, and what the cache does with it (design §2.1).

A request is a closed model. Each part is exactly one of:
- **key material**: part of the cache key (the body's fields, ordinary headers, the query's ordinary parameters);
- **scope material**: who the caller is to the upstream (credential headers, credential query parameters): it
  picks the key's tenant scope and never enters the key's digest, which is an unkeyed hash;
- **transport**: provably does not change the answer, a short list: hop-by-hop fields (RFC 9110 §7.6.1, never
  forwarded), fields the gateway consumes (cache directives, conditionals), the field it rewrites to one value on
  a cacheable request (`Accept-Encoding: identity`), fields it does not forward on a cacheable request (the client
  address a proxy adds), and fields upstreams log but never answer by (request ids, trace context, the user agent,
  SDK telemetry), plus the operator's `server.transport_headers`;
- **refused or bypassed**: decided by the policy (`gateway.keys.policy`) from the body.
What the table does not name is key material: an unknown header or query parameter can only split keys, never
merge two requests the upstream could answer differently. The split is counted per part
(`tokenedge_key_parts_total`), so an operator sees which header or parameter costs hits and can declare it
transport. We key the unclassified rather than forward only the classified: the gateway stays transparent (a
header an upstream needs still reaches it), and the price of an unknown part is a lower hit rate, not a wrong hit.

Names are matched lower-case. Pure functions and constants.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Final
from urllib.parse import unquote


class Part(IntEnum):
    """What a header or query parameter is to the cache."""

    KEYED = 0  # key material
    CREDENTIAL = 1  # scope material
    TRANSPORT = 2  # forwarded; provably no effect on the answer
    HOP = 3  # never forwarded: connection-specific, recomputed by the gateway, or consumed by it
    STRIPPED = 4  # not forwarded on a cacheable request (forwarded on a bypass)


# RFC 9110 §7.6.1: connection-specific fields a proxy must not forward, plus fields the proxy recomputes.
HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Request fields the gateway consumes itself (RFC 9111 directives, conditionals, its own controls).
# `Expect: 100-continue` is answered by the gateway's own server, which has the whole body before it forwards;
# a request body's `Content-Encoding` is decoded by it too (aiohttp), and the decoded body is what is keyed and
# forwarded, so the field no longer describes it.
GATEWAY_ONLY: Final = frozenset(
    {
        *("cache-control", "pragma", "x-tokenedge-debug", "if-none-match", "x-tokenedge-proxy-secret"),
        *("expect", "content-encoding"),
    }
)
# Rewritten to one value on every cacheable request, so the upstream sees the same whatever the client sent.
REWRITTEN: Final = frozenset({"accept-encoding"})
# The client's address as proxies pass it on: per client, never an input to the answer. Not forwarded on a
# cacheable request (the upstream answers the flight, not one client); a bypass forwards it.
CLIENT_ADDRESS: Final = frozenset(
    {"x-forwarded-for", "forwarded", "x-real-ip", "true-client-ip", "cf-connecting-ip", "x-client-ip"}
)
# Logged, never answered by: request ids, trace context, the user agent, SDK telemetry.
TRANSPORT: Final = frozenset(
    {
        "user-agent",
        "x-request-id",
        "request-id",
        "x-correlation-id",
        "x-client-request-id",
        "traceparent",
        "tracestate",
        "baggage",
        "sentry-trace",
        "b3",
        "x-amzn-trace-id",
        "x-cloud-trace-context",
        "x-varnish",
        "cf-ray",
        "via",
        "cdn-loop",
    }
)
TRANSPORT_PREFIXES: Final = ("x-stainless-", "x-b3-")
# Who the caller is to the upstream: always scope material.
CREDENTIAL_HEADERS: Final = (
    "authorization",
    "api-key",
    "x-api-key",
    "openai-organization",
    "openai-project",
    "cookie",
)
# Credential-looking names (headers and query parameters): scope material by default. A false positive costs
# nothing but a finer scope; a false negative would cross callers. Besides keys and tokens, this covers what an
# authenticating proxy in front forwards as the caller's identity: signed assertions (Cloudflare Access's
# `Cf-Access-Jwt-Assertion`, IAP's `X-Goog-Iap-Jwt-Assertion`, ALB's `X-Amzn-Oidc-Data`), identities
# (`X-Forwarded-User`/`-Email`, `Remote-User`, Azure's `X-Ms-Client-Principal`, IAP's `...-User-Email`), client
# certificates (Envoy's `X-Forwarded-Client-Cert`, `Ssl-Client-Cert`) and sessions.
_CREDENTIAL_SUFFIXES: Final = (
    *("-key", "_key", "-token", "_token", "-secret", "_secret", "-signature"),
    *("-user", "_user", "-user-id", "-email", "-groups"),
)
_CREDENTIAL_INFIXES: Final = (
    *("apikey", "api-key", "api_key", "token", "secret", "password", "passwd", "credential"),
    *("jwt", "assertion", "oidc", "session", "signature", "principal", "client-cert", "ssl-client", "cookie"),
)
_CREDENTIAL_PREFIXES: Final = ("x-auth", "auth")
_CREDENTIAL_NAMES: Final = frozenset(
    {"key", "sig", "signature", "code", "sessionid", "remote-user", "x-user"}
)


def credential_looking(name: str) -> bool:
    """A lower-case header or query parameter name that may carry a credential."""
    return (
        name in _CREDENTIAL_NAMES
        or name.endswith(_CREDENTIAL_SUFFIXES)
        or name.startswith(_CREDENTIAL_PREFIXES)
        or any(infix in name for infix in _CREDENTIAL_INFIXES)
    )


@functools.lru_cache(maxsize=4096)
def header_part(name: str, extra_credentials: frozenset[str], extra_transport: frozenset[str]) -> Part:
    """The part a request header is, by its lower-case name (the operator's lists as frozensets)."""
    if name in HOP_BY_HOP or name in GATEWAY_ONLY:
        return Part.HOP
    if name in REWRITTEN:
        return Part.TRANSPORT
    if name in CLIENT_ADDRESS:
        return Part.STRIPPED
    if name in CREDENTIAL_HEADERS or name in extra_credentials or credential_looking(name):
        return Part.CREDENTIAL
    if name in TRANSPORT or name.startswith(TRANSPORT_PREFIXES) or name in extra_transport:
        return Part.TRANSPORT
    return Part.KEYED


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The raw query's `name=value` pairs, in order, undecoded (an empty query: none)."""
    if not raw_query:
        return []
    return [(name, value) for name, _, value in (item.partition("=") for item in raw_query.split("&"))]


def query_part(name: str) -> Part:
    """A query parameter (its raw name): credential-looking names are scope material, the rest key material."""
    return Part.CREDENTIAL if credential_looking(unquote(name).lower()) else Part.KEYED


def wire_material(keyed_headers: Iterable[tuple[str, str]], keyed_query: Iterable[tuple[str, str]]) -> bytes:
    """The key material of a request's headers and query, b"" when there is none.

    Headers sorted by name, each name's values in request order (RFC 9110 §5.3: only the order of fields of the
    same name is significant); query pairs in request order, undecoded (no rule says which spellings a server
    treats alike). Length-prefixed, so no two different sets of parts give the same bytes.
    """
    out = bytearray()
    for tag, pairs in ((b"h", sorted(keyed_headers, key=lambda p: p[0])), (b"q", keyed_query)):
        for name, value in pairs:
            n = name.encode("utf-8", "surrogateescape")
            v = value.encode("utf-8", "surrogateescape")
            out += tag + len(n).to_bytes(4, "big") + n + len(v).to_bytes(4, "big") + v
    return bytes(out)


def wire_parts(wire: bytes) -> list[str]:
    """The parts `wire_material` wrote, as metric labels: `header:NAME` and `query:NAME` (values left out)."""
    out: list[str] = []
    at = 0
    while at < len(wire):
        tag = "header" if wire[at : at + 1] == b"h" else "query"
        size = int.from_bytes(wire[at + 1 : at + 5], "big")
        name = wire[at + 5 : at + 5 + size].decode("utf-8", "replace")
        at += 5 + size
        at += 4 + int.from_bytes(wire[at : at + 4], "big")
        out.append(f"{tag}:{name}")
    return out


# Body fields per endpoint that never reach the answer (design §2): the response's form, the request's bookkeeping.
# A field an endpoint echoes back in its answer is key material there (the Responses object returns `metadata`,
# `user`, `safety_identifier`, `prompt_cache_key` and `service_tier`; chat returns `service_tier`). `cache_salt`
# (vLLM) only isolates the engine's prefix cache; the gateway replaces it (gateway.upstream.routing.salt).
_FORM: Final = frozenset({"stream", "stream_options"})
TRANSPORT_FIELDS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "chat/completions": _FORM
        | {"user", "safety_identifier", "prompt_cache_key", "metadata", "store", "request_id", "cache_salt"},
        "completions": _FORM | {"user", "request_id", "cache_salt"},
        "embeddings": frozenset({"user", "request_id"}),
        "responses": _FORM | {"store"},  # `store` is always false on a cached request (policy)
    }
)
