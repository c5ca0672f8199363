"""Varnish purge client: PURGE with xkey-purge / xkey-softpurge (vmod_xkey,
https://github.com/varnish/varnish-modules/blob/master/src/vmod_xkey.vcc) or BAN with X-Ban-Tags
(https://varnish-cache.org/docs/trunk/users-guide/purging.html#bans), against a local fake listener."""

from __future__ import annotations

import pytest

from cdn.purge import VarnishConfig, VarnishPurgeClient
from tests.cdn.fakes import (
    KEY,
    KEY_TAG,
    FakeVarnish,
    MaxJitter,
    RecordingSleep,
    Reply,
    client_session,
    serve_raw,
)

TOKEN = "varnish-purge-SECRET-42"


def _client(urls: tuple[str, ...], session, **kw) -> VarnishPurgeClient:  # type: ignore[no-untyped-def]
    return VarnishPurgeClient(
        VarnishConfig(purge_urls=urls, **kw), session, sleep=RecordingSleep(), rng=MaxJitter()
    )


async def test_xkey_purge_maps_keys_to_key_tags() -> None:
    fake = FakeVarnish(TOKEN)
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url + "/",), session, token=TOKEN).purge([KEY], ["tenant:t1"])
    assert not fake.violations
    (req,) = fake.requests
    assert req.method == "PURGE" and req.headers["xkey-purge"] == f"{KEY_TAG} tenant:t1"
    assert req.headers["X-Purge-Token"] == TOKEN
    assert result.ok and result.purged == 2 and result.requests == 1


async def test_soft_purge_uses_xkey_softpurge() -> None:
    fake = FakeVarnish()
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url,), session, soft=True).purge([], ["model:m1"])
    assert result.ok and fake.requests[0].headers["xkey-softpurge"] == "model:m1"
    assert "xkey-purge" not in fake.requests[0].headers and "X-Purge-Token" not in fake.requests[0].headers


async def test_ban_mode_sends_ban_with_tags() -> None:
    fake = FakeVarnish()
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url,), session, mode="ban").purge([KEY], [])
    assert (
        result.ok and fake.requests[0].method == "BAN" and fake.requests[0].headers["X-Ban-Tags"] == KEY_TAG
    )


async def test_long_tag_lists_are_split_under_the_header_limit() -> None:
    fake = FakeVarnish()
    tags = [f"t{i}-{'x' * 60}" for i in range(300)]
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url,), session).purge([], tags)
    assert not fake.violations and len(fake.requests) == 3
    assert all(len(r.headers["xkey-purge"]) <= 7168 for r in fake.requests)
    assert [t for r in fake.requests for t in r.headers["xkey-purge"].split(" ")] == tags
    assert result.purged == 300


async def test_every_listener_is_purged_and_one_failure_is_reported() -> None:
    good, bad = FakeVarnish(), FakeVarnish()
    bad.queue(Reply(403, "forbidden"))
    async with client_session() as session, serve_raw(good) as u1, serve_raw(bad) as u2:
        result = await _client((u1, u2), session).purge([], ["t1"])
    assert len(good.requests) == 1 and len(bad.requests) == 1
    assert not result.ok and result.purged == 0 and result.requests == 2
    assert "HTTP 403" in result.errors[0] and u2 in result.errors[0]


async def test_invalid_key_is_reported_and_the_rest_still_purged() -> None:
    fake = FakeVarnish()
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url,), session).purge(["not-a-key", KEY], [])
    assert not result.ok and result.purged == 1 and "not-a-key" in result.errors[0]


async def test_nothing_to_purge_sends_nothing() -> None:
    fake = FakeVarnish()
    async with client_session() as session, serve_raw(fake) as url:
        result = await _client((url,), session).purge([], [])
    assert result.ok and result.requests == 0 and fake.requests == []


@pytest.mark.parametrize(
    "kw", [{"purge_urls": ()}, {"purge_urls": ("ftp://x",)}, {"mode": "ban", "soft": True}, {"mode": "nope"}]
)
def test_config_validates(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"purge_urls": ("http://127.0.0.1:6081/",), **kw}
    with pytest.raises(ValueError):
        VarnishConfig(**args)  # type: ignore[arg-type]


def test_config_repr_redacts_the_token() -> None:
    assert TOKEN not in repr(VarnishConfig(purge_urls=("http://v:6081/",), token=TOKEN))
