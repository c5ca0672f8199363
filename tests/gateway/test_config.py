"""Config: TOML, environment overrides, and validation messages that name the setting."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path

import pytest

from cdn.purge.env import CDN_ENV_NAMES
from gateway.__main__ import build_parser, check_bind, l2_description, main
from gateway.config.sections import RouteLevel
from gateway.config.settings import (
    CACHEABLE_ENDPOINTS,
    ROUTES,
    ConfigError,
    GatewayConfig,
    RouteConfig,
    env_name,
    load_config,
    section_types,
    setting_paths,
)
from gateway.keys.canonical import AUTO, ROUTE_LEVELS

SHIPPED = Path(__file__).parents[2] / "configs" / "gateway.toml"


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
    config = load_config(
        path,
        {
            "TOKENEDGE_CACHE_REDIS_URL": "redis://b:2/0",
            "TOKENEDGE_SERVER_WORKERS": "3",
            "TOKENEDGE_SERVER_UVLOOP": "false",
            "TOKENEDGE_CACHE_CDN_TAG_HEADERS": "xkey",
        },
    )
    assert config.cache.redis_url == "redis://b:2/0"
    assert config.server.workers == 3
    assert config.server.uvloop is False
    assert config.cache.cdn_tag_headers == ("xkey",)


def test_missing_routes_get_defaults() -> None:
    config = GatewayConfig.from_mapping({"routes": {"completions": {"scope": "public"}}})
    assert config.routes["completions"].scope == "public"
    assert config.routes["chat/completions"].scope == "tenant"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"server": {"port": 0}}, "server.port"),
        ({"server": {"port": "eighty"}}, "server.port must be an integer"),
        ({"server": {"prot": 1}}, "server: unknown setting 'prot'; did you mean 'port'?"),
        ({"upstream": {"url": "ftp://x"}}, "upstream.url"),
        ({"cache": {"redis_url": "http://x"}}, "cache.redis_url"),
        ({"routes": {"chat/completions": {"level": "fuzzy"}}}, "routes.chat/completions.level"),
        (
            {"routes": {"completions": {"level": "standard"}}},
            "routes.completions.level: level 'standard' is now called 'normalized'",
        ),
        ({"routes": {"chat/completions": {"scope": "everyone"}}}, "scope"),
        ({"routes": {"images": {}}}, "cacheable routes are"),
        ({"bogus": {}}, "unknown config section [bogus]"),
        ({"cahce": {}}, "unknown config section [cahce]; did you mean 'cache'?"),
        ({"routes": {"chat/completion": {}}}, "did you mean 'chat/completions'?"),
        (
            {"routes": {"embeddings": {"ttl": 5}}},
            "routes.embeddings: unknown setting 'ttl'; did you mean 'ttl_s'?",
        ),
        ({"dashboard": {"prices": ["gpt-4o=1"]}}, "dashboard.prices"),
        ({"dashboard": {"prices": ["m=1/2", "m=3/4"]}}, "priced twice"),
        ({"server": {"uvloop": "maybe"}}, "must be a boolean"),
    ],
)
def test_invalid_settings_fail_naming_the_setting(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
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


def test_l2_selects_redis_or_memcached() -> None:
    def kind(**cache: object) -> str:
        return GatewayConfig.from_mapping({"cache": cache}).cache.l2_kind

    assert kind() == ""
    assert kind(redis_url="redis://h:1/0") == "redis"
    assert kind(memcached_servers=["h:11211"]) == "memcached"
    assert kind(redis_url="redis://h:1/0", memcached_servers=["h:11211"]) == "redis"  # redis is the default
    assert kind(redis_url="redis://h:1/0", memcached_servers=["h:11211"], l2="memcached") == "memcached"
    env = load_config(
        None, {"TOKENEDGE_CACHE_L2": "memcached", "TOKENEDGE_CACHE_MEMCACHED_SERVERS": "a:1,b:2"}
    )
    assert env.cache.memcached_servers == ("a:1", "b:2")


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"l2": "memcached"}, "cache.memcached_servers"),
        ({"l2": "redis"}, "cache.redis_url"),
        ({"l2": "mongo"}, "cache.l2 must be one of"),
        ({"memcached_servers": ["no-port"]}, "host:port"),
        ({"memcached_servers": ["h:0"]}, "host:port"),
        ({"memcached_max_item_bytes": 10}, "memcached_max_item_bytes"),
        ({"memcached_l1_max_age_s": -1}, "memcached_l1_max_age_s"),
    ],
)
def test_invalid_l2_settings_fail_naming_the_setting(cache: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        GatewayConfig.from_mapping({"cache": cache})


def test_every_setting_is_in_the_shipped_file_with_its_default_and_a_comment() -> None:
    """Generic over the dataclasses: a field added to any section fails here until gateway.toml lists it."""
    data = tomllib.loads(SHIPPED.read_text())
    for name, klass in section_types().items():
        assert name in data, f"configs/gateway.toml lacks the [{name}] section"
        missing = {f.name for f in dataclasses.fields(klass)} - set(data[name])
        assert not missing, f"configs/gateway.toml [{name}] lacks {sorted(missing)}"
        shipped = getattr(GatewayConfig.from_mapping({name: data[name]}), name)
        assert shipped == klass(), (
            f"[{name}] in configs/gateway.toml differs from the defaults in gateway/config/settings.py"
        )
    for endpoint in CACHEABLE_ENDPOINTS:
        missing = {f.name for f in dataclasses.fields(GatewayConfig().routes[endpoint])} - set(
            data[ROUTES][endpoint]
        )
        assert not missing, f"configs/gateway.toml [routes.{endpoint!r}] lacks {sorted(missing)}"
    commented = _commented_keys(SHIPPED.read_text())
    for setting in setting_paths():
        table = setting[0] if setting[0] != ROUTES else ROUTES
        assert (table, setting[-1]) in commented, (
            f"{'.'.join(setting)} has no comment in configs/gateway.toml"
        )


def _commented_keys(text: str) -> set[tuple[str, str]]:
    """(top-level table, key) for each `key = value  # comment` line (a route's comment covers every route)."""
    out: set[tuple[str, str]] = set()
    table = ""
    for line in text.splitlines():
        if match := re.match(r"\[([A-Za-z_]+)", line):
            table = match.group(1)
        elif match := re.match(r"([a-z_0-9]+) = .*#", line):
            out.add((table, match.group(1)))
    return out


def test_every_setting_has_one_environment_name() -> None:
    names = [env_name(setting) for setting in setting_paths()]
    assert len(names) == len(set(names))
    assert "TOKENEDGE_ROUTES_CHAT_COMPLETIONS_LEVEL" in names and "TOKENEDGE_DASHBOARD_PRICES" in names


def test_routes_are_overridden_from_the_environment() -> None:
    config = load_config(
        SHIPPED,
        {
            "TOKENEDGE_ROUTES_CHAT_COMPLETIONS_TTL_S": "60",
            "TOKENEDGE_ROUTES_EMBEDDINGS_ENABLED": "false",
            "TOKENEDGE_ROUTES_COMPLETIONS_SCOPE": "public",
            "TOKENEDGE_ROUTES_COMPLETIONS_LEVEL": "exact",
        },
    )
    assert config.routes["chat/completions"].ttl_s == 60
    assert config.routes["embeddings"].enabled is False and config.routes["embeddings"].ttl_s == 86400
    assert config.routes["completions"].scope == "public" and config.routes["completions"].level == "exact"


def test_an_invalid_route_value_from_the_environment_fails_naming_it() -> None:
    with pytest.raises(ConfigError, match=re.escape("routes.chat/completions.level must be one of")):
        load_config(None, {"TOKENEDGE_ROUTES_CHAT_COMPLETIONS_LEVEL": "bogus"})


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("TOKENEDGE_SEVRER_PORT", "TOKENEDGE_SERVER_PORT"),
        ("TOKENEDGE_CACHE_REDIS_URI", "TOKENEDGE_CACHE_REDIS_URL"),
        ("TOKENEDGE_ROUTES_CHAT_COMPLETION_LEVEL", "TOKENEDGE_ROUTES_CHAT_COMPLETIONS_LEVEL"),
        ("TOKENEDGE_VARNISH_PURGE_ULR", "TOKENEDGE_VARNISH_PURGE_URL"),
    ],
)
def test_a_misspelled_variable_fails_naming_the_valid_one(name: str, suggestion: str) -> None:
    with pytest.raises(
        ConfigError, match=f"unknown environment variable {name}; did you mean '{suggestion}'"
    ):
        load_config(None, {name: "1"})


def test_other_components_variables_are_left_alone() -> None:
    config = load_config(
        None,
        {
            "TOKENEDGE_BACKEND_PORT": "8001",
            "TOKENEDGE_CONFIG": "x.toml",
            "TOKENEDGE_VARNISH_PURGE_URL": "http://v",
            "PATH": "/bin",
        },
    )
    assert config == GatewayConfig()


def test_a_misspelled_toml_key_fails_startup_naming_the_valid_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.toml"
    path.write_text("[cache]\nstale_if_eror_s = 5\n")
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'stale_if_error_s'?" in err


def test_a_misspelled_variable_fails_startup(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOKENEDGE_SERVER_PROT", "9000")
    assert main(["--print-url"]) == 2
    assert "did you mean 'TOKENEDGE_SERVER_PORT'?" in capsys.readouterr().err


def test_print_config_shows_each_value_and_its_source(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOKENEDGE_ROUTES_EMBEDDINGS_TTL_S", "77")
    monkeypatch.setenv("TOKENEDGE_SERVER_ADMIN_TOKEN", "s3cret")
    assert main(["--config", str(SHIPPED), "--print-config", "--port", "9123"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(" = ")[0] + "@" + section: line for section, body in _tables(out) for line in body}
    assert lines["port@server"].startswith("port = 9123  # flag --port")
    assert lines["ttl_s@routes.embeddings"].startswith("ttl_s = 77  # env TOKENEDGE_ROUTES_EMBEDDINGS_TTL_S")
    assert lines["ttl_s@routes.completions"].startswith(f"ttl_s = 3600  # {SHIPPED}")
    assert lines["uvloop@server"].startswith("uvloop = true  # ")
    assert "s3cret" not in out and 'admin_token = "***"' in out
    assert len(lines) == len(setting_paths())
    reloaded = tomllib.loads(out)  # the output is TOML
    assert reloaded["routes"]["embeddings"]["ttl_s"] == 77


def _tables(text: str) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("["):
            out.append((line.strip("[]").replace('"', ""), []))
        elif line.strip():
            out[-1][1].append(line)
    return out


def test_every_flag_is_documented() -> None:
    actions = [a for a in build_parser()._actions if a.option_strings]
    assert {"--host", "--port", "--workers", "--config", "--print-config", "--print-url"} <= {
        s for a in actions for s in a.option_strings
    }
    assert all(a.help and len(a.help) > 10 for a in actions), [
        a.option_strings for a in actions if not a.help
    ]


def test_a_port_in_use_is_a_one_line_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on .*127.0.0.1:{port}: Address already in use"):
            check_bind("127.0.0.1", port)
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenedge-gateway: configuration error: cannot listen") and err.count("\n") == 1


def test_an_unresolvable_host_is_a_configuration_error() -> None:
    expected = "cannot resolve server.host/server.port no-such-host.invalid:8080"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_bind("no-such-host.invalid", 8080)


def test_every_cdn_variable_the_purge_clients_read_is_known_to_the_config() -> None:
    """cdn/purge/config.py reads these; a new one missing from cdn/purge/env.py would stop the gateway."""
    source = (SHIPPED.parents[1] / "cdn" / "purge" / "config.py").read_text()
    read = set(re.findall(r'"(TOKENEDGE_[A-Z0-9_]+[A-Z0-9])"', source))
    read |= {
        f"TOKENEDGE_AKAMAI_{n}" for n in ("HOST", "CLIENT_TOKEN", "CLIENT_SECRET", "ACCESS_TOKEN")
    }  # in a loop
    assert read and read <= set(CDN_ENV_NAMES)


def test_route_levels_are_the_canonicalization_levels_plus_auto() -> None:
    assert (
        typing.get_args(RouteLevel) == ROUTE_LEVELS == ("auto", "exact", "tokens", "normalized", "aggressive")
    )
    for level in ROUTE_LEVELS:
        assert (
            GatewayConfig.from_mapping({"routes": {"embeddings": {"level": level}}})
            .routes["embeddings"]
            .level
            == level
        )
    with pytest.raises(ConfigError, match="'standard' is now called 'normalized'"):
        RouteConfig(level="standard")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cache", "named"),
    [
        ({}, "off"),
        ({"redis_url": "redis://localhost:6379/0"}, "redis"),
        ({"redis_url": "redis+cluster://a:7000,b:7001"}, "redis cluster"),
        ({"memcached_servers": ["127.0.0.1:11211", "127.0.0.1:11212"]}, "memcached (2 servers)"),
        (
            {"l2": "memcached", "memcached_servers": ["m:11211"], "redis_url": "redis://r:6379"},
            "memcached (1 server)",
        ),
    ],
)
def test_the_start_up_line_names_the_l2_in_use(cache: dict[str, object], named: str) -> None:
    config = GatewayConfig.from_mapping({"upstream": {"url": "http://u:8000"}, "cache": cache})
    assert l2_description(config.cache) == named


@pytest.mark.parametrize("level", ["tokens", "normalized", "aggressive"])
def test_the_responses_route_keys_at_exact_only(level: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("routes.responses: level")):
        GatewayConfig.from_mapping(
            {"upstream": {"url": "http://u:8000"}, "routes": {"responses": {"level": level}}}
        )
