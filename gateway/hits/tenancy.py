"""The tenant scope of a request: who the caller is to the upstream, as a keyed hash (no I/O, no app state).

Scope (design §3): a keyed BLAKE2b over every request part that identifies the caller to the upstream, so two
callers share entries only when the upstream would see the same credentials. Which parts those are is the request
table's (`gateway.keys.parts`): `Authorization` of any scheme, `api-key` (Azure), `x-api-key`, `Cookie`,
`OpenAI-Organization`, `OpenAI-Project`, every credential-looking header name (`*-key`, `*api-key*`, `*token*`,
`x-auth*`, ...), the operator's `server.credential_headers`, and the query's credential-looking parameters
(`?key=`, `?api-key=`, `?subscription-key=`, ...). Every value counts, in a length-prefixed encoding (no two
different sets of parts hash the same bytes), headers by name (RFC 9110 §5.3: the order of differently named
fields carries nothing), query parameters in order. The key is the deployment's secret (`gateway.hits.secret`), so a
scope reveals nothing about a credential and every replica computes the same scope. A request with none of these
parts is `anon`: all such callers share one scope, which is right only when they are indeed the same caller to the
upstream; `server.refuse_anonymous` makes them a 401 instead. The same pass collects the request's key-material
headers and query parameters (`wire`, for the key's digest). A bounded per-process memo maps the raw credential
values to their scope (in memory only, like the request itself; never logged or persisted) so a hit pays one dict
lookup.

Trusted tenant header: `server.tenant_header` names the tenant only on requests from a trusted proxy (a peer in
`server.tenant_trusted_cidrs`, or a request carrying `X-Tokenedge-Proxy-Secret` equal to
`server.tenant_proxy_secret`). From anyone else it is ignored and the credentials decide. A trusted request
without it is a 401, never `anon`: the proxy's duty is to set it on every request (and strip a client's own).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

from gateway.config.settings import ServerConfig
from gateway.keys.parts import CREDENTIAL_HEADERS, Part, header_part, query_pairs, query_part, wire_material
from gateway.web.errors import Unauthorized

ANONYMOUS_SCOPE: Final = "anon"
Pairs = tuple[tuple[str, str], ...]
PROXY_SECRET_HEADER: Final = "X-Tokenedge-Proxy-Secret"
_PERSON: Final = b"te-scope"
MEMO_ENTRIES: Final = 4096  # distinct credential sets remembered per process (cleared when full)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_K = TypeVar("_K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Tenancy:
    secret: bytes
    credential_headers: tuple[str, ...]  # lower-case names, the built-in ones first (more match by pattern)
    tenant_header: str
    trusted: tuple[Network, ...]
    proxy_secret: str
    refuse_anonymous: bool
    transport_headers: frozenset[str] = frozenset()  # the operator's `server.transport_headers`, lower-case
    _memo: dict[tuple[Pairs, Pairs], str] = field(default_factory=dict, compare=False, repr=False)
    # The fast lane's key: each credential header's (lower-case name, raw value), in request order.
    _raw_memo: dict[tuple[tuple[bytes, bytes], ...], str] = field(
        default_factory=dict, compare=False, repr=False
    )
    _credential_set: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_credential_set", frozenset(self.credential_headers))

    @classmethod
    def from_config(cls, server: ServerConfig, secret: bytes) -> Tenancy:
        extra = tuple(h.lower() for h in server.credential_headers if h.lower() not in CREDENTIAL_HEADERS)
        return cls(
            secret=hashlib.blake2b(secret, digest_size=32, person=_PERSON).digest(),
            credential_headers=CREDENTIAL_HEADERS + extra,
            tenant_header=server.tenant_header,
            trusted=tuple(ipaddress.ip_network(c, strict=False) for c in server.tenant_trusted_cidrs),
            proxy_secret=server.tenant_proxy_secret,
            refuse_anonymous=server.refuse_anonymous,
            transport_headers=frozenset(h.lower() for h in server.transport_headers),
        )

    def part(self, name: str) -> Part:
        """What the lower-case header `name` is to the cache (gateway.keys.parts)."""
        return header_part(name, self._credential_set, self.transport_headers)

    def split(self, headers: Mapping[str, str], query: str = "") -> tuple[Pairs, Pairs, bytes]:
        """(credential headers sorted by name, credential query pairs, the key material of the other headers and
        query pairs): one pass over the request's parts, each classified by the request table."""
        creds: list[tuple[str, str]] = []
        keyed: list[tuple[str, str]] = []
        for name, value in headers.items():
            lower = name.lower()
            kind = self.part(lower)
            if kind is Part.CREDENTIAL:
                if value.strip():
                    creds.append((lower, value))
            elif kind is Part.KEYED:
                keyed.append((lower, value))
        creds.sort(key=lambda p: p[0])  # stable: a name's values stay in request order
        qcreds: list[tuple[str, str]] = []
        qkeyed: list[tuple[str, str]] = []
        for pair in query_pairs(query):
            (qcreds if query_part(pair[0]) is Part.CREDENTIAL else qkeyed).append(pair)
        return tuple(creds), tuple(qcreds), wire_material(keyed, qkeyed)

    def is_trusted(self, headers: Mapping[str, str], peer: str | None) -> bool:
        """A trusted proxy: a peer in the trusted CIDRs, or the shared proxy secret (compared in constant time)."""
        if self.proxy_secret:
            offered = headers.get(PROXY_SECRET_HEADER, "")
            if offered and hmac.compare_digest(offered.encode(), self.proxy_secret.encode()):
                return True
        if self.trusted and peer:
            try:
                address = ipaddress.ip_address(peer)
            except ValueError:
                return False
            return any(address in network for network in self.trusted)
        return False

    def scope(self, headers: Mapping[str, str], peer: str | None, query: str = "") -> str:
        """`t` + 16 hex digits, or `anon`; raises Unauthorized where the configuration refuses the request."""
        return self.classify(headers, peer, query)[0]

    def classify(self, headers: Mapping[str, str], peer: str | None, query: str = "") -> tuple[str, bytes]:
        """(the scope, the key material of the request's other headers and query): see `scope`."""
        creds, qcreds, wire = self.split(headers, query)
        if self.tenant_header and self.is_trusted(headers, peer):
            value = headers.get(self.tenant_header, "").strip()
            if not value:
                raise Unauthorized(f"the trusted proxy sent no {self.tenant_header} header")
            return self._hash(((b"tenant", value.encode("utf-8", "surrogateescape")),)), wire
        scope = _remembered(self._memo, (creds, qcreds), lambda: self._credential_scope(creds, qcreds))
        if scope == ANONYMOUS_SCOPE and self.refuse_anonymous:
            raise Unauthorized(
                "a credential is required (Authorization, api-key, x-api-key or a key parameter)"
            )
        return scope, wire

    def scope_of_raw(self, raw: tuple[tuple[bytes, bytes], ...], compute: Callable[[], str]) -> str:
        """The scope of a request whose credential headers are `raw` ((lower-case name, value) in request order;
        no trusted tenant header configured): the same raw headers are the same `getall` values for every name, so
        the same scope. `compute` (the request's `scope`) runs on a miss and may raise; a refusal is not kept."""
        return _remembered(self._raw_memo, raw, compute)

    def _credential_scope(self, creds: Pairs, qcreds: Pairs) -> str:
        parts = [_encoded(name, value) for name, value in creds]
        parts += [_encoded("?" + name, value) for name, value in qcreds]  # "?" keeps the two namespaces apart
        return self._hash(parts) if parts else ANONYMOUS_SCOPE

    def _hash(self, parts: Iterable[tuple[bytes, bytes]]) -> str:
        digest = hashlib.blake2b(key=self.secret, digest_size=8, person=_PERSON)
        for name, value in parts:
            digest.update(len(name).to_bytes(4, "big") + name + len(value).to_bytes(4, "big") + value)
        return "t" + digest.hexdigest()


def _encoded(name: str, value: str) -> tuple[bytes, bytes]:
    return name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape")


def _remembered(memo: dict[_K, str], key: _K, compute: Callable[[], str]) -> str:
    """`memo[key]`, computed on a miss; the memo is cleared when it holds MEMO_ENTRIES (a hot set re-fills it)."""
    scope = memo.get(key)
    if scope is None:
        scope = compute()
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[key] = scope
    return scope
