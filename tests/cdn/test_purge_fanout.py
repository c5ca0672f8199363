"""fan_out, CdnConfig / load_cdn_config_from_env and build_purge_clients: every configured CDN is purged
concurrently and one CDN's failure (even an exception) is reported, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from cdn.purge import (
    CdnConfig,
    CloudflareConfig,
    FastlyConfig,
    PurgeClient,
    PurgeResult,
    RetryPolicy,
    build_purge_clients,
    fan_out,
    load_cdn_config_from_env,
)
from tests.cdn.fakes import (
    KEY,
    FakeCloudflare,
    FakeFastly,
    MaxJitter,
    RecordingSleep,
    Reply,
    client_session,
    serve,
)


class Exploding:
    name = "exploding"

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
        raise RuntimeError("boom with secret SECRET-xyz")


async def test_one_failing_cdn_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    fastly, cloudflare = FakeFastly("f-SECRET", "svc"), FakeCloudflare("c-SECRET", "zone")
    cloudflare.queue(*[Reply(502, "bad gateway")] * 2)
    caplog.set_level(logging.DEBUG)
    async with client_session() as session, serve(fastly) as fu, serve(cloudflare) as cu:
        config = CdnConfig(
            fastly=FastlyConfig("f-SECRET", "svc", base_url=fu),
            cloudflare=CloudflareConfig("c-SECRET", "zone", base_url=cu, retry=RetryPolicy(max_attempts=2)),
        )
        clients: list[PurgeClient] = [
            *build_purge_clients(config, session, sleep=RecordingSleep(), rng=MaxJitter()),
            Exploding(),
        ]
        results = await fan_out(clients, [KEY], ["model:m1"])
    assert set(results) == {"fastly", "cloudflare", "exploding"}
    assert results["fastly"].ok and results["fastly"].purged == 2
    assert not results["cloudflare"].ok and results["cloudflare"].requests == 2
    assert results["exploding"] == PurgeResult("exploding", False, 0, 0, ("unexpected RuntimeError",))
    assert "SECRET" not in caplog.text


async def test_fan_out_with_no_clients_is_empty() -> None:
    assert await fan_out([], [KEY], []) == {}


async def test_duplicate_client_names_are_rejected() -> None:
    with pytest.raises(ValueError):
        await fan_out([Exploding(), Exploding()], [], [])


ENV = {
    "TOKENEDGE_FASTLY_API_TOKEN": "f-SECRET",
    "TOKENEDGE_FASTLY_SERVICE_ID": "svc",
    "TOKENEDGE_CLOUDFLARE_API_TOKEN": "c-SECRET",
    "TOKENEDGE_CLOUDFLARE_ZONE_ID": "zone",
    "TOKENEDGE_AKAMAI_HOST": "akab-h.purge.akamaiapis.net",
    "TOKENEDGE_AKAMAI_CLIENT_TOKEN": "ct-SECRET",
    "TOKENEDGE_AKAMAI_CLIENT_SECRET": "cs-SECRET",
    "TOKENEDGE_AKAMAI_ACCESS_TOKEN": "at-SECRET",
    "TOKENEDGE_AKAMAI_NETWORK": "staging",
    "TOKENEDGE_VARNISH_PURGE_URL": "http://10.0.0.1:6081/, http://10.0.0.2:6081/",
    "TOKENEDGE_VARNISH_PURGE_TOKEN": "v-SECRET",
    "TOKENEDGE_CDN_SOFT_PURGE": "1",
    "HOME": "/root",
}


async def test_env_configures_every_provider_and_builds_their_clients() -> None:
    config = load_cdn_config_from_env(ENV)
    assert config.enabled == ("varnish", "fastly", "cloudflare", "akamai")
    assert config.varnish is not None and config.varnish.purge_urls == (
        "http://10.0.0.1:6081/",
        "http://10.0.0.2:6081/",
    )
    assert config.varnish.soft and config.fastly is not None and config.fastly.soft
    assert (
        config.akamai is not None
        and config.akamai.network == "staging"
        and config.akamai.operation == "invalidate"
    )
    assert "SECRET" not in repr(config)
    async with client_session() as session:
        assert [c.name for c in build_purge_clients(config, session)] == [
            "varnish",
            "fastly",
            "cloudflare",
            "akamai",
        ]


def test_empty_env_configures_nothing() -> None:
    assert load_cdn_config_from_env({"TOKENEDGE_FASTLY_API_TOKEN": " "}) == CdnConfig()


def test_half_configured_provider_names_missing_variables_not_values() -> None:
    with pytest.raises(ValueError, match="TOKENEDGE_AKAMAI_CLIENT_SECRET") as info:
        load_cdn_config_from_env({k: v for k, v in ENV.items() if k != "TOKENEDGE_AKAMAI_CLIENT_SECRET"})
    assert "SECRET" not in str(info.value).replace("CLIENT_SECRET", "")


def test_bad_enum_values_are_rejected() -> None:
    with pytest.raises(ValueError):
        load_cdn_config_from_env({**ENV, "TOKENEDGE_AKAMAI_NETWORK": "prod"})
    with pytest.raises(ValueError):
        load_cdn_config_from_env({**ENV, "TOKENEDGE_CDN_SOFT_PURGE": "maybe"})
