"""Config for many upstreams: `upstream.url` as a list, `[[upstream.backends]]` tables, typo-proof like the rest."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway.__main__ import main
from gateway.config.settings import ConfigError, GatewayConfig, load_config
from gateway.config.upstream import BackendConfig


def test_one_url_is_one_target() -> None:
    config = GatewayConfig().upstream
    assert config.targets == (BackendConfig("http://127.0.0.1:8000"),) and config.primary_url == config.url


def test_url_takes_a_list_in_toml_and_a_comma_separated_string_in_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[upstream]\nurl = ["http://a:1", "http://b:2"]\n')
    assert [t.url for t in load_config(path, {}).upstream.targets] == ["http://a:1", "http://b:2"]
    env = {"TOKENEDGE_UPSTREAM_URL": "http://a:1, http://c:3"}
    assert [t.url for t in load_config(None, env).upstream.targets] == ["http://a:1", "http://c:3"]


def test_backend_tables_carry_weights_and_models_and_win_over_url(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        '[upstream]\nurl = "http://ignored:1"\n'
        '[[upstream.backends]]\nurl = "http://a:1"\nweight = 2\n'
        '[[upstream.backends]]\nurl = "http://b:2"\nmodels = ["m"]\n'
    )
    targets = load_config(path, {}).upstream.targets
    assert targets == (BackendConfig("http://a:1", 2.0), BackendConfig("http://b:2", 1.0, ("m",)))


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ({"backends": [{"url": "http://a:1", "wieght": 2}]}, "did you mean 'weight'"),
        ({"backends": [{"url": "http://a:1", "weight": 0}]}, "weight must be > 0"),
        ({"backends": [{"weight": 1}]}, "upstream.backends[0]: upstream backend url"),
        ({"backends": "http://a:1"}, "array of tables"),
        ({"url": ["http://a:1", "ftp://b"]}, "upstream.url must be http(s)"),
        ({"url": []}, "at least one"),
        ({"url": 5}, "a URL or a list of URLs"),
        ({"health_path": "v1/models"}, "health_path"),
        ({"affinity_load_factor": 0.5}, "affinity_load_factor"),
        ({"eject_base_s": 60.0}, "eject_base_s"),
    ],
)
def test_bad_backend_settings_fail_naming_the_setting(upstream: dict, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        GatewayConfig.from_mapping({"upstream": upstream})


def test_print_config_shows_backends_as_loadable_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[[upstream.backends]]\nurl = "http://u:pw@a:1"\nweight = 3.0\nmodels = ["m"]\n')
    assert main(["--config", str(path), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "pw" not in out
    backends = tomllib.loads(out)["upstream"]["backends"]
    assert backends == [
        {
            "url": "http://u:***@a:1",
            "weight": 3.0,
            "models": ["m"],
            **{"name": "", "slots": 0, "prefill_tokens_per_s": 2000.0, "max_outstanding": 0},
        }
    ]
