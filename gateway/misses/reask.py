"""`python -m gateway warm --top N`: after a model revision change, re-ask the hottest recorded requests.

The requests come from the shared hot-key record (gateway/tiers/hotrecord.py), hottest first, one per distinct request
(the same bytes recorded under the old and the new revision are asked once; a streamed request is asked as JSON). They are sent to the gateway itself,
not to the model server, so the gateway builds the keys with the revision it now knows and stores the answers
in L2 (and its L1) exactly as for a client; an answer already cached under the new revision comes back as a hit
and costs the model nothing. Sends start at most `--rate` per second, at most `--concurrency` at a time.

Only requests the gateway may re-ask without a caller's credential were recorded: public routes (`pub` scope) and
requests that carried no credential (`anon` scope; the operator's `upstream.api_key` serves them). Re-asks carry no
credential, so they land on the same scopes. Tenant-scoped entries are not re-asked: the gateway does not keep
tenants' credentials, and a re-ask under any other credential would fill a different key.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
import orjson
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as Metric

from gateway.config.settings import ConfigError, GatewayConfig, load_config
from gateway.tiers.hotrecord import HotRecord, HotSettings, Replayable
from gateway.tiers.redis_cluster import cluster_client, is_cluster_url

Send = Callable[[Replayable], Awaitable[str]]
READ_CHUNK = 1000


def select(recorded: Sequence[Replayable | None], top: int, revision: str | None = None) -> list[Replayable]:
    """The first `top` distinct requests (hottest first), optionally only those answered by `revision`."""
    seen: set[tuple[str, bytes]] = set()
    chosen: list[Replayable] = []
    for req in recorded:
        if req is None or (revision is not None and req.revision != revision):
            continue
        if (req.path, req.body) in seen:
            continue
        seen.add((req.path, req.body))
        chosen.append(req)
        if len(chosen) >= top:
            break
    return chosen


async def reask(
    items: Sequence[Replayable],
    send: Send,
    *,
    rate_per_s: float,
    concurrency: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Counter[str]:
    """Send each item, the i-th no earlier than start + i / rate; outcomes counted (hit, stored, status-NNN...)."""
    outcomes: Counter[str] = Counter()
    gate = asyncio.Semaphore(concurrency)
    start = clock()

    async def one(item: Replayable) -> None:
        try:
            outcomes[await send(item)] += 1
        finally:
            gate.release()

    tasks = []
    for i, item in enumerate(items):
        delay = start + i / rate_per_s - clock()
        if delay > 0:
            await sleep(delay)
        await gate.acquire()
        tasks.append(asyncio.ensure_future(one(item)))
    await asyncio.gather(*tasks)
    return outcomes


def unstreamed(body: bytes) -> bytes:
    """A streamed request asked as JSON: `stream` is not part of the key (design §2), one entry serves both, and a
    JSON answer says in its Cache-Status whether it was stored."""
    if b'"stream' not in body:
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(doc, dict):
        return body
    doc.pop("stream", None)
    doc.pop("stream_options", None)
    return orjson.dumps(doc)


def http_sender(session: aiohttp.ClientSession, base_url: str) -> Send:
    async def send(item: Replayable) -> str:
        try:
            async with session.post(
                base_url + item.path, data=unstreamed(item.body), headers={"Content-Type": "application/json"}
            ) as resp:
                await resp.read()
                status = resp.headers.get("Cache-Status", "")
        except (aiohttp.ClientError, TimeoutError):
            return "error"
        if resp.status != 200:
            return f"status-{resp.status}"
        return "hit" if "; hit" in status else "stored" if "stored" in status else "not-stored"

    return send


def gateway_url(config: GatewayConfig) -> str:
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(config.server.host, config.server.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{config.server.port}"


async def recorded_requests(config: GatewayConfig) -> list[Replayable | None]:
    """Every recorded request, hottest first (bounded by `cache.hot_record_max_keys`)."""
    c = config.cache
    client: aioredis.Redis = (
        cluster_client(c.redis_url, timeout_s=5.0)
        if is_cluster_url(  # type: ignore[assignment]
            c.redis_url
        )
        else aioredis.Redis.from_url(c.redis_url, socket_timeout=5.0)
    )
    settings = HotSettings(
        max_keys=c.hot_record_max_keys,
        batch=1,
        flush_s=1.0,
        half_life_s=1.0,
        max_request_bytes=0,
        timeout_s=5.0,
    )
    record = HotRecord(
        client, settings, time.time, Metric("unused", "", ["outcome"], registry=CollectorRegistry())
    )
    try:
        keys = await record.top(c.hot_record_max_keys)
        out: list[Replayable | None] = []
        for start in range(0, len(keys), READ_CHUNK):
            out += await record.requests(keys[start : start + READ_CHUNK])
        return out
    finally:
        await client.aclose()


async def warm(
    config: GatewayConfig, *, top: int, rate_per_s: float, concurrency: int, url: str, revision: str | None
) -> Counter[str]:
    items = select(await recorded_requests(config), top, revision)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=config.upstream.read_timeout_s)
    # Each recorded request is its own caller: no cookie from one answer rides on the next request.
    async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as session:
        return await reask(items, http_sender(session, url), rate_per_s=rate_per_s, concurrency=concurrency)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenedge-gateway warm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="PATH", help="TOML config file (default: $TOKENEDGE_CONFIG)")
    parser.add_argument("--top", type=int, required=True, help="how many of the hottest distinct requests")
    parser.add_argument("--rate", type=float, default=5.0, help="requests started per second (default 5)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at most (default 4)")
    parser.add_argument("--url", help="the gateway to ask (default: server.host:server.port of the config)")
    parser.add_argument("--revision", help="only requests answered by this (old) model revision")
    return parser


def main(argv: Sequence[str], env: dict[str, str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.top < 1 or args.rate <= 0 or args.concurrency < 1:
        print("tokenedge-gateway warm: --top and --concurrency must be >= 1, --rate > 0", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config or env.get("TOKENEDGE_CONFIG"), env)
    except ConfigError as exc:
        print(f"tokenedge-gateway warm: configuration error: {exc}", file=sys.stderr)
        return 2
    if config.cache.l2_kind != "redis":
        print(
            "tokenedge-gateway warm: needs a Redis L2 (cache.redis_url): the hot-key record lives there",
            file=sys.stderr,
        )
        return 2
    outcomes = asyncio.run(
        warm(
            config,
            top=args.top,
            rate_per_s=args.rate,
            concurrency=args.concurrency,
            url=(args.url or gateway_url(config)).rstrip("/"),
            revision=args.revision,
        )
    )
    summary = ", ".join(f"{name} {count}" for name, count in sorted(outcomes.items())) or "nothing recorded"
    print(f"re-asked {sum(outcomes.values())} request(s): {summary}")
    failed = sum(count for name, count in outcomes.items() if name not in ("hit", "stored", "not-stored"))
    return 1 if failed else 0
