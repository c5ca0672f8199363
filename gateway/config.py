"""Gateway configuration: frozen dataclasses loaded once from TOML, then `TOKENEDGE_*` environment overrides.

Config is data: every component receives its own section explicitly; nothing reads the environment later.
Validation happens here, at startup, with messages that name the offending setting.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.canonical import Level

CACHEABLE_ENDPOINTS: tuple[str, ...] = ("chat/completions", "completions", "embeddings")
ENV_PREFIX = "TOKENEDGE_"
_T = typing.TypeVar("_T")


class ConfigError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_body_bytes: int = 4 * 1024 * 1024
    admin_token: str = ""  # empty: admin endpoints are disabled (404), never open
    tenant_header: str = ""  # when set, this header (not the bearer token) names the tenant
    uvloop: bool = True
    dashboard_public_on_loopback: bool = True
    access_log_sample_rate: float = 0.0

    def __post_init__(self) -> None:
        _require(0 < self.port < 65536, f"server.port must be 1-65535, got {self.port}")
        _require(1 <= self.workers <= 256, f"server.workers must be 1-256, got {self.workers}")
        _require(self.max_body_bytes >= 1024, "server.max_body_bytes must be at least 1024")
        _require(0.0 <= self.access_log_sample_rate <= 1.0, "server.access_log_sample_rate must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str = "http://127.0.0.1:8000"
    api_key: str = ""  # when set, injected upstream instead of forwarding the client's Authorization
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 120.0  # per socket read (sock_read), never a total: long generations are not cut
    model_revision: str = ""  # used when the upstream's /v1/models reports none
    models_ttl_s: float = 30.0
    max_connections: int = 256
    revision_push: bool = True  # follow the upstream's revision stream (GET /tokenedge/revisions) when offered

    def __post_init__(self) -> None:
        _require(self.url.startswith(("http://", "https://")), f"upstream.url must be http(s)://..., got {self.url!r}")
        _require(self.connect_timeout_s > 0, "upstream.connect_timeout_s must be > 0")
        _require(self.read_timeout_s > 0, "upstream.read_timeout_s must be > 0")
        _require(self.models_ttl_s >= 0, "upstream.models_ttl_s must be >= 0")
        _require(self.max_connections >= 1, "upstream.max_connections must be >= 1")

    def __repr__(self) -> str:
        return f"UpstreamConfig(url={self.url!r}, api_key={'***' if self.api_key else ''!r})"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    l1_max_bytes: int = 256 * 1024 * 1024  # 0 disables L1
    redis_url: str = ""  # empty: L1 only (the embedded default)
    redis_timeout_s: float = 0.25
    redis_retry_after_s: float = 1.0  # after an L2 failure, skip L2 this long before trying again
    bus_ping_interval_s: float = 1.0  # idle invalidation subscription pings Redis this often; 3 unanswered: L1 off
    max_entry_bytes: int = 2 * 1024 * 1024
    stale_if_error_s: int = 600
    cdn_tag_headers: tuple[str, ...] = ("surrogate-key", "cache-tag", "xkey")

    def __post_init__(self) -> None:
        _require(self.l1_max_bytes >= 0, "cache.l1_max_bytes must be >= 0")
        _require(self.redis_url == "" or self.redis_url.startswith(("redis://", "rediss://", "unix://")),
                 f"cache.redis_url must be redis://, rediss:// or unix://, got {self.redis_url!r}")
        _require(self.redis_timeout_s > 0, "cache.redis_timeout_s must be > 0")
        _require(self.redis_retry_after_s >= 0, "cache.redis_retry_after_s must be >= 0")
        _require(self.bus_ping_interval_s > 0, "cache.bus_ping_interval_s must be > 0")
        _require(self.max_entry_bytes >= 1024, "cache.max_entry_bytes must be at least 1024")
        _require(self.stale_if_error_s >= 0, "cache.stale_if_error_s must be >= 0")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    level: Level = Level.STANDARD
    scope: Literal["tenant", "public"] = "tenant"
    ttl_s: int = 3600
    enabled: bool = True
    allow_seeded: bool = False
    allow_n_gt_1: bool = False

    def __post_init__(self) -> None:
        _require(self.scope in ("tenant", "public"), f"route scope must be 'tenant' or 'public', got {self.scope!r}")
        _require(self.ttl_s >= 1, f"route ttl_s must be >= 1, got {self.ttl_s}")


@dataclass(frozen=True, slots=True)
class StreamConfig:
    heartbeat_s: float = 15.0
    replay_chunk_chars: int = 0  # 0: replay the stored chunk boundaries; N: re-chunk JSON-recorded entries
    replay_delay_s: float = 0.0  # optional pacing between replayed chunks
    complete_abandoned_streams: bool = False
    abandoned_stream_max_s: float = 120.0

    def __post_init__(self) -> None:
        _require(self.heartbeat_s > 0, "stream.heartbeat_s must be > 0")
        _require(self.replay_chunk_chars >= 0, "stream.replay_chunk_chars must be >= 0")
        _require(self.replay_delay_s >= 0, "stream.replay_delay_s must be >= 0")


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

    def __post_init__(self) -> None:
        _require(self.cache_max_bytes >= 0, "tokens.cache_max_bytes must be >= 0")
        _require(self.tokens_per_minute >= 0, "tokens.tokens_per_minute must be >= 0")
        _require(self.burst_tokens >= 0, "tokens.burst_tokens must be >= 0")


def _default_routes() -> dict[str, RouteConfig]:
    return {endpoint: RouteConfig() for endpoint in CACHEABLE_ENDPOINTS}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    routes: Mapping[str, RouteConfig] = field(default_factory=_default_routes)

    def __post_init__(self) -> None:
        for endpoint in self.routes:
            _require(endpoint in CACHEABLE_ENDPOINTS,
                     f"routes.{endpoint!r}: cacheable routes are {', '.join(CACHEABLE_ENDPOINTS)}")
        missing = [e for e in CACHEABLE_ENDPOINTS if e not in self.routes]
        if missing:
            object.__setattr__(self, "routes", {**self.routes, **{e: RouteConfig() for e in missing}})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GatewayConfig:
        unknown = set(data) - {"server", "upstream", "cache", "stream", "tokens", "routes"}
        _require(not unknown, f"unknown config sections: {', '.join(sorted(unknown))}")
        routes_raw = data.get("routes", {})
        _require(isinstance(routes_raw, Mapping), "routes must be a table")
        return cls(
            server=_build(ServerConfig, data.get("server", {}), "server"),
            upstream=_build(UpstreamConfig, data.get("upstream", {}), "upstream"),
            cache=_build(CacheConfig, data.get("cache", {}), "cache"),
            stream=_build(StreamConfig, data.get("stream", {}), "stream"),
            tokens=_build(TokensConfig, data.get("tokens", {}), "tokens"),
            routes={name: _build(RouteConfig, raw, f"routes.{name}") for name, raw in routes_raw.items()},
        )


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """TOML file (optional), then `TOKENEDGE_{SECTION}_{FIELD}` overrides, e.g. `TOKENEDGE_CACHE_REDIS_URL`."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    return GatewayConfig.from_mapping(_apply_env(data, os.environ if environ is None else environ))


_SECTIONS: dict[str, type] = {"server": ServerConfig, "upstream": UpstreamConfig, "cache": CacheConfig,
                              "stream": StreamConfig, "tokens": TokensConfig}


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        for section, klass in _SECTIONS.items():
            if rest.startswith(section + "_"):
                field_name = rest[len(section) + 1:]
                if field_name in {f.name for f in dataclasses.fields(klass)}:
                    merged.setdefault(section, {})[field_name] = value
                break
    return merged


def _build(klass: type[_T], raw: Any, where: str) -> _T:
    _require(isinstance(raw, Mapping), f"{where} must be a table")
    hints = typing.get_type_hints(klass)
    names = {f.name for f in dataclasses.fields(klass)}  # type: ignore[arg-type]
    unknown = set(raw) - names
    _require(not unknown, f"{where}: unknown settings {', '.join(sorted(unknown))}")
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in raw.items()}
    try:
        return klass(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Coerce TOML values and environment strings to the declared type, or fail naming the setting."""
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where} must be a boolean, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be {'an integer' if hint is int else 'a number'}, got {value!r}") from None
        if hint is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(str(i).strip() for i in items if str(i).strip())
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{where} must be one of {typing.get_args(hint)}, got {value!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, Level):
        try:
            return Level(value)
        except ValueError:
            raise ConfigError(f"{where} must be one of {[lv.value for lv in Level]}, got {value!r}") from None
    if origin in (types.UnionType, typing.Union):
        return value
    return value
