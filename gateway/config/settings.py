"""Gateway configuration: frozen dataclasses loaded once from TOML, then `TOKENEDGE_*` environment overrides.

Config is data: every component receives its own section explicitly; nothing reads the environment later.
Validation happens here, at startup, with messages that name the offending setting.

Every setting has exactly one environment name, derived from its path: `server.port` is `TOKENEDGE_SERVER_PORT`,
`routes."chat/completions".level` is `TOKENEDGE_ROUTES_CHAT_COMPLETIONS_LEVEL` (upper case, every run of other
characters one `_`). The sections and fields are read from the dataclasses, so a field added here is settable from
TOML and the environment with no other change. A `TOKENEDGE_*` variable or a TOML key that names no setting is a
startup error naming the closest valid one, never ignored; only the other components' prefixes are left alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cdn.purge.env import CDN_ENV_NAMES
from gateway.config.sections import (
    CACHEABLE_ENDPOINTS,
    RENAMED_VALUES,
    CacheConfig,
    ConfigError,
    DashboardConfig,
    RouteConfig,
    ServerConfig,
    StreamConfig,
    TokensConfig,
    TracingConfig,
    did_you_mean,
    require,
)
from gateway.config.upstream import UpstreamConfig

ENV_PREFIX = "TOKENEDGE_"
# Read by other components, not by this config: the config file path, the CDN purge clients, and the backend
# (which checks its own `TOKENEDGE_BACKEND_*`).
FOREIGN_ENV_NAMES: tuple[str, ...] = ("TOKENEDGE_CONFIG", *CDN_ENV_NAMES)
FOREIGN_ENV_PREFIXES: tuple[str, ...] = ("TOKENEDGE_BACKEND_",)
_T = typing.TypeVar("_T")


def _default_routes() -> dict[str, RouteConfig]:
    return {endpoint: RouteConfig() for endpoint in CACHEABLE_ENDPOINTS}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    routes: Mapping[str, RouteConfig] = field(default_factory=_default_routes)

    def __post_init__(self) -> None:
        for endpoint in self.routes:
            require(
                endpoint in CACHEABLE_ENDPOINTS,
                f"routes.{endpoint!r}: cacheable routes are "
                f"{', '.join(CACHEABLE_ENDPOINTS)}{did_you_mean(endpoint, CACHEABLE_ENDPOINTS)}",
            )
        responses = self.routes.get("responses")
        require(
            responses is None or responses.level in ("auto", "exact"),
            "routes.responses: level must be 'auto' or 'exact' (the gateway knows neither the model input a Responses "
            "request renders to nor a safe text normalization of its items)",
        )
        missing = [e for e in CACHEABLE_ENDPOINTS if e not in self.routes]
        if missing:
            object.__setattr__(self, "routes", {**self.routes, **{e: RouteConfig() for e in missing}})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GatewayConfig:
        sections = section_types()
        for name in sorted(set(data) - set(sections) - {ROUTES}):
            raise ConfigError(f"unknown config section [{name}]{did_you_mean(name, [*sections, ROUTES])}")
        routes_raw = data.get(ROUTES, {})
        require(isinstance(routes_raw, Mapping), "routes must be a table")
        built: dict[str, Any] = {
            name: _build(klass, data.get(name, {}), name) for name, klass in sections.items()
        }
        routes = {name: _build(RouteConfig, raw, f"routes.{name}") for name, raw in routes_raw.items()}
        return cls(**built, routes=routes)


ROUTES = "routes"


def section_types() -> dict[str, type]:
    """Section name -> its dataclass, read from `GatewayConfig` (routes, keyed by endpoint, apart)."""
    hints = typing.get_type_hints(GatewayConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(GatewayConfig)
        if dataclasses.is_dataclass(hints[f.name])
    }


def setting_paths() -> list[tuple[str, ...]]:
    """Every setting: `(section, field)`, and `("routes", endpoint, field)` for each cacheable route."""
    paths: list[tuple[str, ...]] = [
        (name, f.name) for name, klass in section_types().items() for f in dataclasses.fields(klass)
    ]
    paths += [
        (ROUTES, endpoint, f.name)
        for endpoint in CACHEABLE_ENDPOINTS
        for f in dataclasses.fields(RouteConfig)
    ]
    return paths


def env_name(path: tuple[str, ...]) -> str:
    """`("routes", "chat/completions", "level")` -> `TOKENEDGE_ROUTES_CHAT_COMPLETIONS_LEVEL`."""
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", "_".join(path).upper()).strip("_")


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(f'"{p}"' if "/" in p else p for p in path)


def load_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    sources: dict[str, str] | None = None,
) -> GatewayConfig:
    """TOML file (optional), then `TOKENEDGE_*` overrides (module docstring); `sources` gets each setting's origin.

    `sources` maps every dotted setting (`server.port`, `routes."chat/completions".level`) to `default`, the file
    path, or `env NAME`.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    env_set = _apply_env(data, os.environ if environ is None else environ)
    config = GatewayConfig.from_mapping(data)
    if sources is not None:
        for setting in setting_paths():
            origin = str(path) if setting[-1] in _parent(data, setting) else "default"
            sources[dotted(setting)] = env_set.get(setting, origin)
    return config


def _parent(data: Mapping[str, Any], setting: tuple[str, ...]) -> Mapping[str, Any]:
    where: Any = data
    for part in setting[:-1]:
        where = where.get(part, {}) if isinstance(where, Mapping) else {}
    return where if isinstance(where, Mapping) else {}


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """Write every `TOKENEDGE_*` setting into `data` (in place); an unknown name fails. Returns path -> source."""
    known = {env_name(setting): setting for setting in setting_paths()}
    applied: dict[tuple[str, ...], str] = {}
    for name in sorted(environ):
        if (
            not name.startswith(ENV_PREFIX)
            or name in FOREIGN_ENV_NAMES
            or name.startswith(FOREIGN_ENV_PREFIXES)
        ):
            continue
        setting = known.get(name)
        if setting is None:
            raise ConfigError(
                f"unknown environment variable {name}{did_you_mean(name, [*known, *CDN_ENV_NAMES])}"
                " (TOKENEDGE_{SECTION}_{SETTING}, see configs/gateway.toml)"
            )
        table = data
        for part in setting[:-1]:
            existing = table.get(part)
            table[part] = table = dict(existing) if isinstance(existing, Mapping) else {}
        table[setting[-1]] = environ[name]
        applied[setting] = f"env {name}"
    return applied


def _build(klass: type[_T], raw: Any, where: str) -> _T:
    require(isinstance(raw, Mapping), f"{where} must be a table")
    hints = typing.get_type_hints(klass)
    names = [f.name for f in dataclasses.fields(klass)]  # type: ignore[arg-type]
    for unknown in sorted(set(raw) - set(names)):
        raise ConfigError(f"{where}: unknown setting {unknown!r}{did_you_mean(unknown, names)}")
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in raw.items()}
    try:
        return klass(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _build_tables(klass: Any, value: Any, where: str) -> tuple[Any, ...]:
    """An array of tables (`[[upstream.backends]]`): each built and checked like a section."""
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where} must be an array of tables ([[{where}]] in the TOML file), got {value!r}")
    return tuple(_build(klass, item, f"{where}[{i}]") for i, item in enumerate(value))


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
            raise ConfigError(
                f"{where} must be {'an integer' if hint is int else 'a number'}, got {value!r}"
            ) from None
        if hint is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if origin is tuple and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        return _build_tables(typing.get_args(hint)[0], value, where)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(str(i).strip() for i in items if str(i).strip())
    if origin is Literal:
        if isinstance(value, str) and value in RENAMED_VALUES and value not in typing.get_args(hint):
            raise ConfigError(f"{where}: {RENAMED_VALUES[value]}")
        if value not in typing.get_args(hint):
            raise ConfigError(
                f"{where} must be one of {typing.get_args(hint)}, got {value!r}"
                f"{did_you_mean(str(value), [str(v) for v in typing.get_args(hint)])}"
            )
        return value
    if origin in (types.UnionType, typing.Union):
        return value
    return value
