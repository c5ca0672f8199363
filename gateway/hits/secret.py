"""The per-deployment secret that keys tenant scopes (design §3): one value on every worker and every replica.

Order: `server.scope_secret` from config; else, when Redis is configured, the value under `SECRET_KEY`, created
once with `SET NX` so concurrent first starts agree; else the file `{server.state_dir}/scope_secret`, created once
(write a temporary file, then `link` it into place, so concurrent workers agree) where the operator can read,
back up or rotate it. Rotating the secret changes every tenant scope: old entries become unreachable (misses),
never shared. The value is never logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from gateway.config.settings import GatewayConfig
from gateway.tiers.redis_cluster import REDIS_FAILURES, cluster_client, is_cluster_url

SECRET_KEY = "tokenedge:scope-secret"
SECRET_FILE = "scope_secret"
log = logging.getLogger("tokenedge.secret")


async def load_scope_secret(config: GatewayConfig) -> bytes:
    if config.server.scope_secret:
        return config.server.scope_secret.encode()
    if config.cache.redis_url:
        try:
            return await _from_redis(config.cache.redis_url, config.cache.redis_timeout_s)
        except REDIS_FAILURES as exc:
            log.warning(
                "scope secret: Redis unreachable (%s); using the file under %s, so replicas will not share "
                "entries until it is reachable at start",
                type(exc).__name__,
                config.server.state_dir,
            )
    return file_secret(Path(config.server.state_dir))


async def _from_redis(url: str, timeout_s: float) -> bytes:
    client: aioredis.Redis | RedisCluster = (
        cluster_client(url, timeout_s=max(timeout_s, 2.0))
        if is_cluster_url(url)
        else aioredis.Redis.from_url(url, socket_timeout=max(timeout_s, 2.0), socket_connect_timeout=2.0)
    )
    try:
        await client.set(SECRET_KEY, secrets.token_hex(32), nx=True)
        value = await client.get(SECRET_KEY)
    finally:
        await client.aclose()
    if not value:
        raise RedisError("scope secret vanished right after SET NX")
    return value.encode() if isinstance(value, str) else bytes(value)


def file_secret(state_dir: Path) -> bytes:
    """The secret in `state_dir/scope_secret`, created (mode 0600) by whichever process gets there first."""
    path = state_dir / SECRET_FILE
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # fails if another process linked first: then theirs is the secret
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ValueError(f"{path} is empty: delete it to have a new scope secret created")
    return value.encode()
