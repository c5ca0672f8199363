"""Config: TOML, environment overrides, and validation messages that name the setting."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from gateway.canonical import AUTO, ROUTE_LEVELS
from gateway.config import ConfigError, GatewayConfig, RouteConfig, RouteLevel, load_config


def test_shipped_config_loads_with_embedded_defaults() -> None:
    config = load_config(Path(__file__).parents[2] / "configs" / "gateway.toml", {})
    assert config.server.port == 8080
    assert config.cache.redis_url == ""
    assert {route.level for route in config.routes.values()} == {AUTO}
    assert GatewayConfig().routes["completions"].level == AUTO
    assert config.routes["embeddings"].ttl_s == 86400


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[cache]\nredis_url = "redis://a:1/0"\n[server]\nworkers = 1\n')
    config = load_config(path, {"TOKENEDGE_CACHE_REDIS_URL": "redis://b:2/0", "TOKENEDGE_SERVER_WORKERS": "3",
                                "TOKENEDGE_SERVER_UVLOOP": "false", "TOKENEDGE_CACHE_CDN_TAG_HEADERS": "xkey"})
    assert config.cache.redis_url == "redis://b:2/0"
    assert config.server.workers == 3
    assert config.server.uvloop is False
    assert config.cache.cdn_tag_headers == ("xkey",)


def test_missing_routes_get_defaults() -> None:
    config = GatewayConfig.from_mapping({"routes": {"completions": {"scope": "public"}}})
    assert config.routes["completions"].scope == "public"
    assert config.routes["chat/completions"].scope == "tenant"


@pytest.mark.parametrize(("data", "message"), [
    ({"server": {"port": 0}}, "server.port"),
    ({"server": {"port": "eighty"}}, "server.port must be an integer"),
    ({"server": {"prot": 1}}, "unknown settings prot"),
    ({"upstream": {"url": "ftp://x"}}, "upstream.url"),
    ({"cache": {"redis_url": "http://x"}}, "cache.redis_url"),
    ({"routes": {"chat/completions": {"level": "fuzzy"}}}, "routes.chat/completions.level"),
    ({"routes": {"completions": {"level": "standard"}}}, "routes.completions.level: level 'standard' is now called "
                                                         "'normalized'"),
    ({"routes": {"chat/completions": {"scope": "everyone"}}}, "scope"),
    ({"routes": {"images": {}}}, "cacheable routes are"),
    ({"bogus": {}}, "unknown config sections"),
    ({"server": {"uvloop": "maybe"}}, "must be a boolean"),
])
def test_invalid_settings_fail_naming_the_setting(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        GatewayConfig.from_mapping(data)


def test_missing_file_and_bad_toml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", {})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad, {})


def test_upstream_key_is_redacted_in_repr() -> None:
    config = GatewayConfig.from_mapping({"upstream": {"api_key": "sk-secret"}})
    assert "sk-secret" not in repr(config.upstream)


def test_route_levels_are_the_canonicalization_levels_plus_auto() -> None:
    assert typing.get_args(RouteLevel) == ROUTE_LEVELS == ("auto", "exact", "tokens", "normalized", "aggressive")
    for level in ROUTE_LEVELS:
        assert GatewayConfig.from_mapping({"routes": {"embeddings": {"level": level}}}).routes["embeddings"].level == level
    with pytest.raises(ConfigError, match="'standard' is now called 'normalized'"):
        RouteConfig(level="standard")  # type: ignore[arg-type]
