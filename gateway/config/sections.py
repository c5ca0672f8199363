"""The gateway's config sections: one frozen, slotted dataclass per component, each validating itself.

`gateway.config.settings` assembles them into `GatewayConfig` and loads it (TOML, then the environment); this module holds
what a section is and what it accepts, with messages that name the offending setting.
"""

from __future__ import annotations

import difflib
import ipaddress
import typing
from dataclasses import dataclass
from typing import Any, Literal

from gateway.keys.canonical import AUTO, ROUTE_LEVELS
from gateway.keys.policy import CACHEABLE_ENDPOINTS as CACHEABLE_ENDPOINTS  # defined once there; re-exported

RouteLevel = Literal[
    "auto", "exact", "tokens", "normalized", "aggressive"
]  # gateway.keys.canonical.ROUTE_LEVELS
# Values that used to be valid: the message says what they are called now.
RENAMED_VALUES: dict[Any, str] = {
    "standard": "level 'standard' is now called 'normalized' and is opt-in (it rewrites text, so it may serve an "
    "answer the model would not give to the exact text); the safe default is 'auto'"
}


class ConfigError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def did_you_mean(name: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_body_bytes: int = 4 * 1024 * 1024
    admin_token: str = ""  # empty: admin endpoints are disabled (404), never open
    tenant_header: str = ""  # when set, names the tenant on requests from a trusted proxy (below) only
    tenant_trusted_cidrs: tuple[str, ...] = ()  # proxies whose tenant_header is honoured
    tenant_proxy_secret: str = ""  # or: requests carrying X-Tokenedge-Proxy-Secret with this value
    credential_headers: tuple[str, ...] = ()  # extra headers that identify the caller upstream (in the scope)
    # Headers the operator knows the upstream never answers by (an ingress's own ids): transport, not key material
    # (gateway/keys/parts.py). Every other unclassified header splits keys.
    transport_headers: tuple[str, ...] = ()
    refuse_anonymous: bool = (
        False  # 401 for cacheable requests with no credential instead of the shared `anon`
    )
    scope_secret: str = (
        ""  # keys tenant scopes; empty: created once (Redis SET NX, else state_dir/scope_secret)
    )
    state_dir: str = ".tokenedge"
    uvloop: bool = True
    dashboard_public_on_loopback: bool = True
    metrics_require_token: bool = False  # /metrics like /dashboard: admin token unless direct loopback
    access_log_sample_rate: float = 0.0
    header_read_timeout_s: float = 5.0  # per read while a request's head is arriving
    header_total_s: float = 10.0  # the whole head
    body_read_timeout_s: float = 10.0  # per read while a request body is arriving
    body_total_s: float = 60.0  # the whole body
    max_connections: int = 4096  # per process; connections beyond are closed at once
    fast_lane: bool = True  # known hits answered from the read, before parsing (gateway/edge/fastlane.py)
    drain_grace_s: float = 0.0  # SIGTERM: /ready is 503 at once; new connections are accepted this long
    drain_timeout_s: float = 30.0  # SIGTERM: in-flight work may run this long from the signal, then is cut

    def __post_init__(self) -> None:
        require(0 < self.port < 65536, f"server.port must be 1-65535, got {self.port}")
        require(1 <= self.workers <= 256, f"server.workers must be 1-256, got {self.workers}")
        require(self.max_body_bytes >= 1024, "server.max_body_bytes must be at least 1024")
        require(0.0 <= self.access_log_sample_rate <= 1.0, "server.access_log_sample_rate must be in [0, 1]")
        require(
            not self.tenant_header or bool(self.tenant_trusted_cidrs or self.tenant_proxy_secret),
            "server.tenant_header needs server.tenant_trusted_cidrs or server.tenant_proxy_secret: "
            "a tenant header from an untrusted client is ignored",
        )
        for cidr in self.tenant_trusted_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"server.tenant_trusted_cidrs: {cidr!r} is not an address or CIDR"
                ) from None
        for name in ("header_read_timeout_s", "header_total_s", "body_read_timeout_s", "body_total_s"):
            require(getattr(self, name) > 0, f"server.{name} must be > 0")
        require(self.max_connections >= 1, "server.max_connections must be >= 1")
        require(
            0.0 <= self.drain_grace_s <= self.drain_timeout_s,
            "server.drain_grace_s must be in [0, server.drain_timeout_s]",
        )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    l1_max_bytes: int = 256 * 1024 * 1024  # 0 disables L1
    redis_url: str = ""  # empty: L1 only (the embedded default)
    redis_timeout_s: float = 0.25
    redis_retry_after_s: float = 1.0  # after an L2 failure, skip L2 this long before trying again
    l2: Literal["", "redis", "memcached"] = (
        ""  # empty: redis when redis_url is set, memcached when only servers are
    )
    memcached_servers: tuple[str, ...] = ()  # host:port each; keys spread over them by rendezvous hashing
    memcached_timeout_s: float = 0.25
    memcached_retry_after_s: float = 1.0
    memcached_max_item_bytes: int = (
        1024 * 1024
    )  # memcached's item limit (-I); bigger records are refused, counted
    memcached_l1_max_age_s: float = (
        2.0  # with a Memcached L2 (no invalidation bus): L1 lifetime cap, 0 turns L1 off
    )
    bus_ping_interval_s: float = (
        1.0  # idle invalidation subscription pings Redis this often; 3 unanswered: L1 off
    )
    max_entry_bytes: int = 2 * 1024 * 1024
    stale_if_error_s: int = 600
    cdn_tag_headers: tuple[str, ...] = ("surrogate-key", "cache-tag", "xkey")
    # True only behind an edge that keys every answer by the caller's credentials (the shipped Varnish and nginx
    # configs do): tenant answers then tell it `max-age`. False: `CDN-Cache-Control: private` and
    # `Surrogate-Control: no-store`, so an edge that keys without the credential never shares one (RFC 9213).
    cdn_credential_keyed_edge: bool = False
    lease_enabled: bool = (
        True  # with a Redis L2: one replica fills a missed key, the others wait (gateway/misses/lease.py)
    )
    lease_ttl_s: float = (
        2.0  # renewed while the holder lives; a dead holder delays the others at most this long
    )
    lease_max_wait_s: float = 30.0  # a waiter past this goes upstream itself
    lease_streams: bool = True  # streamed misses wait for another replica's stored entry and replay it
    hot_record_enabled: bool = (
        True  # with a Redis L2: a decayed hot-key count for warm-up (gateway/tiers/hotrecord.py)
    )
    hot_record_max_keys: int = (
        10000  # the record keeps this many hottest keys (and their replayable requests)
    )
    hot_record_batch: int = 256  # distinct keys counted locally before one background flush to Redis
    hot_record_flush_s: float = 10.0  # and a flush at least this often
    hot_record_half_life_s: float = 3600.0  # scores halve over this long
    hot_record_max_request_bytes: int = 65536  # larger requests are counted but not kept for `gateway warm`
    warm_fill_top: int = 1000  # on start, fill L1 with this many hottest L2 entries before /ready (0: off)
    warm_fill_timeout_s: float = 10.0  # /ready waits at most this long for that fill

    def __post_init__(self) -> None:
        require(self.l1_max_bytes >= 0, "cache.l1_max_bytes must be >= 0")
        require(
            self.redis_url == ""
            or self.redis_url.startswith(
                ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
            ),
            f"cache.redis_url must be redis://, rediss://, unix:// or redis+cluster://, got {self.redis_url!r}",
        )
        if self.redis_url.startswith(("redis+cluster://", "rediss+cluster://")):
            nodes = self.redis_url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].split(",")
            require(
                all(n.rpartition(":")[0] and n.rpartition(":")[2].isdigit() for n in nodes),
                f"cache.redis_url: cluster nodes must be host:port[,host:port...], got {self.redis_url!r}",
            )
        require(self.redis_timeout_s > 0, "cache.redis_timeout_s must be > 0")
        require(self.redis_retry_after_s >= 0, "cache.redis_retry_after_s must be >= 0")
        require(self.l2 != "redis" or bool(self.redis_url), "cache.l2 = 'redis' needs cache.redis_url")
        require(
            self.l2 != "memcached" or bool(self.memcached_servers),
            "cache.l2 = 'memcached' needs cache.memcached_servers (host:port, ...)",
        )
        for server in self.memcached_servers:
            host, sep, port = server.rpartition(":")
            require(
                bool(sep and host) and port.isdigit() and 0 < int(port) < 65536,
                f"cache.memcached_servers entries must be host:port, got {server!r}",
            )
        require(self.memcached_timeout_s > 0, "cache.memcached_timeout_s must be > 0")
        require(self.memcached_retry_after_s >= 0, "cache.memcached_retry_after_s must be >= 0")
        require(self.memcached_max_item_bytes >= 1024, "cache.memcached_max_item_bytes must be at least 1024")
        require(self.memcached_l1_max_age_s >= 0, "cache.memcached_l1_max_age_s must be >= 0")
        require(self.bus_ping_interval_s > 0, "cache.bus_ping_interval_s must be > 0")
        require(self.max_entry_bytes >= 1024, "cache.max_entry_bytes must be at least 1024")
        require(self.stale_if_error_s >= 0, "cache.stale_if_error_s must be >= 0")
        require(self.lease_ttl_s >= 0.05, "cache.lease_ttl_s must be >= 0.05")
        require(self.lease_max_wait_s >= 0, "cache.lease_max_wait_s must be >= 0")
        require(self.hot_record_max_keys >= 1, "cache.hot_record_max_keys must be >= 1")
        require(self.hot_record_batch >= 1, "cache.hot_record_batch must be >= 1")
        require(self.hot_record_flush_s > 0, "cache.hot_record_flush_s must be > 0")
        require(self.hot_record_half_life_s > 0, "cache.hot_record_half_life_s must be > 0")
        require(self.hot_record_max_request_bytes >= 0, "cache.hot_record_max_request_bytes must be >= 0")
        require(self.warm_fill_top >= 0, "cache.warm_fill_top must be >= 0")
        require(self.warm_fill_timeout_s >= 0, "cache.warm_fill_timeout_s must be >= 0")

    @property
    def l2_kind(self) -> Literal["", "redis", "memcached"]:
        """The shared tier in use: `l2` when set, else redis when `redis_url` is set, else memcached when servers are."""
        if self.l2:
            return self.l2
        return "redis" if self.redis_url else ("memcached" if self.memcached_servers else "")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    level: RouteLevel = (
        AUTO  # auto: `tokens` where the model's tokenizer (and chat template) is known, else `exact`
    )
    scope: Literal["tenant", "public"] = "tenant"
    ttl_s: int = 3600
    enabled: bool = True
    # Seeded sampled requests are cached where the upstream promises invariant seeded sampling (/v1/models
    # `tokenedge.seeded_invariant`); true caches them on any upstream: unsafe on engines that are not invariant.
    allow_seeded: bool = False
    allow_n_gt_1: bool = False

    def __post_init__(self) -> None:
        require(
            self.level in ROUTE_LEVELS,
            RENAMED_VALUES.get(
                self.level, f"route level must be one of {', '.join(ROUTE_LEVELS)}, got {self.level!r}"
            ),
        )
        require(
            self.scope in ("tenant", "public"),
            f"route scope must be 'tenant' or 'public', got {self.scope!r}",
        )
        require(self.ttl_s >= 1, f"route ttl_s must be >= 1, got {self.ttl_s}")


@dataclass(frozen=True, slots=True)
class StreamConfig:
    heartbeat_s: float = 15.0
    replay_chunk_chars: int = 0  # 0: replay the stored chunk boundaries; N: re-chunk JSON-recorded entries
    replay_delay_s: float = 0.0  # optional pacing between replayed chunks
    complete_abandoned_streams: bool = False
    abandoned_stream_max_s: float = 120.0

    def __post_init__(self) -> None:
        require(self.heartbeat_s > 0, "stream.heartbeat_s must be > 0")
        require(self.replay_chunk_chars >= 0, "stream.replay_chunk_chars must be >= 0")
        require(self.replay_delay_s >= 0, "stream.replay_delay_s must be >= 0")


@dataclass(frozen=True, slots=True)
class TokensConfig:
    enabled: bool = True  # count tokens on misses and bypasses when the model's tokenizer is known
    cache_max_bytes: int = 64 * 1024 * 1024  # the request-level token-id cache
    cache_dir: str = ""  # tokenizers fetched from the backend; empty: ~/.cache/tokenedge/tokenizers
    phrases_file: str = ""  # JSON array of hot phrases (whole lines) spliced with precomputed ids
    binary_transport: bool = True  # send misses as int32 ids to a backend that advertises "binary"
    tokens_per_minute: int = 0  # per tenant; 0 disables the token-rate limit
    burst_tokens: int = 0  # bucket size; 0: tokens_per_minute
    openai_models: bool = True  # count OpenAI models (cl100k_base, offline) for the rate limit
    # Token-exact keys for third-party engines (vLLM/SGLang `POST /tokenize`, llama.cpp `/apply-template`):
    # used only once a probe verified them (gateway/tokens/remote.py); any failure keys the request `exact`.
    remote_tokenize: bool = True
    remote_timeout_s: float = 0.5  # one remote tokenization, queueing for a slot included
    remote_concurrency: int = 16  # remote tokenizations in flight at once, per process
    remote_breaker_failures: int = 5  # consecutive failures that open the breaker (requests key `exact`)
    remote_breaker_cooldown_s: float = 30.0
    remote_probe_ttl_s: float = 300.0  # a verdict (verified or not) is probed again after this long

    def __post_init__(self) -> None:
        require(self.cache_max_bytes >= 0, "tokens.cache_max_bytes must be >= 0")
        require(self.remote_timeout_s > 0, "tokens.remote_timeout_s must be > 0")
        require(self.remote_concurrency >= 1, "tokens.remote_concurrency must be >= 1")
        require(self.remote_breaker_failures >= 1, "tokens.remote_breaker_failures must be >= 1")
        require(self.remote_breaker_cooldown_s >= 0, "tokens.remote_breaker_cooldown_s must be >= 0")
        require(self.remote_probe_ttl_s > 0, "tokens.remote_probe_ttl_s must be > 0")
        require(self.tokens_per_minute >= 0, "tokens.tokens_per_minute must be >= 0")
        require(self.burst_tokens >= 0, "tokens.burst_tokens must be >= 0")


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    # USD per million tokens, "MODEL=INPUT/OUTPUT" (e.g. "gpt-4o-mini=0.15/0.60"); "*" prices any other model.
    prices: tuple[str, ...] = ()
    top_keys: int = 20  # rows in the hot-keys table
    show_prompts: bool = (
        False  # the hot-keys table shows the start of each key's prompt (off: never any text)
    )

    def __post_init__(self) -> None:
        from gateway.config.cost import parse_prices

        try:
            parse_prices(self.prices)
        except ValueError as exc:
            raise ConfigError(f"dashboard.prices: {exc}") from None
        require(1 <= self.top_keys <= 1000, f"dashboard.top_keys must be 1-1000, got {self.top_keys}")


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """OpenTelemetry traces (gateway/ops/tracing.py). The standard `OTEL_*` variables, where set, win over these
    (`OTEL_TRACES_EXPORTER=otlp` turns tracing on; `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`,
    `OTEL_TRACES_SAMPLER` replace `endpoint`, `service_name`, `sample_rate`), as every OTel SDK reads them."""

    enabled: bool = False  # off: no span, no import of OpenTelemetry, one check per request
    # The collector's OTLP/HTTP base URL (spans go to {endpoint}/v1/traces); empty: the SDK's default,
    # http://localhost:4318
    endpoint: str = ""
    service_name: str = "tokenedge-gateway"
    sample_rate: float = 1.0  # the share traced: the gateway's own traces and a caller's sampled ones alike

    def __post_init__(self) -> None:
        require(0.0 <= self.sample_rate <= 1.0, f"tracing.sample_rate must be 0-1, got {self.sample_rate}")
        require(
            not self.endpoint or self.endpoint.startswith(("http://", "https://")),
            f"tracing.endpoint must be an http(s) URL, got {self.endpoint!r}",
        )
        require(bool(self.service_name), "tracing.service_name must not be empty")
