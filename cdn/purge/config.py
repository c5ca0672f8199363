"""CDN purge configuration: one frozen dataclass with an optional section per provider, loaded from the
environment (credentials live there or in the gateway's config, never in code) and turned into clients.

Environment (empty values count as unset; a provider is enabled when its required variables are set, and a
half-configured provider is an error that names the missing variables, never their values):

    TOKENEDGE_VARNISH_PURGE_URL      required for Varnish; comma-separated for several listeners
    TOKENEDGE_VARNISH_PURGE_TOKEN    optional, sent as X-Purge-Token
    TOKENEDGE_VARNISH_PURGE_MODE     xkey (default) | ban
    TOKENEDGE_FASTLY_API_TOKEN, TOKENEDGE_FASTLY_SERVICE_ID
    TOKENEDGE_CLOUDFLARE_API_TOKEN, TOKENEDGE_CLOUDFLARE_ZONE_ID
    TOKENEDGE_AKAMAI_HOST, TOKENEDGE_AKAMAI_CLIENT_TOKEN, TOKENEDGE_AKAMAI_CLIENT_SECRET,
    TOKENEDGE_AKAMAI_ACCESS_TOKEN    required for Akamai
    TOKENEDGE_AKAMAI_NETWORK         production (default) | staging
    TOKENEDGE_AKAMAI_OPERATION       invalidate (default) | delete
    TOKENEDGE_CDN_SOFT_PURGE         1 to soft-purge on Varnish (xkey-softpurge) and Fastly (Fastly-Soft-Purge)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import aiohttp

from cdn.purge.akamai import AkamaiConfig, AkamaiPurgeClient
from cdn.purge.base import PurgeClient
from cdn.purge.cloudflare import CloudflareConfig, CloudflarePurgeClient
from cdn.purge.edgegrid import EdgeGridCredentials
from cdn.purge.fastly import FastlyConfig, FastlyPurgeClient
from cdn.purge.retry import RetryPolicy, Sleep, Uniform
from cdn.purge.varnish import VarnishConfig, VarnishPurgeClient

__all__ = ["CdnConfig", "build_purge_clients", "load_cdn_config_from_env"]


@dataclass(frozen=True, slots=True)
class CdnConfig:
    """Which CDNs to purge; each section is optional and its repr redacts credentials."""

    varnish: VarnishConfig | None = None
    fastly: FastlyConfig | None = None
    cloudflare: CloudflareConfig | None = None
    akamai: AkamaiConfig | None = None

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(n for n in ("varnish", "fastly", "cloudflare", "akamai") if getattr(self, n) is not None)


def load_cdn_config_from_env(environ: Mapping[str, str], retry: RetryPolicy | None = None) -> CdnConfig:
    env = {k: v.strip() for k, v in environ.items() if k.startswith("TOKENEDGE_") and v.strip()}
    policy = retry or RetryPolicy()
    soft = _flag(env, "TOKENEDGE_CDN_SOFT_PURGE")
    config: dict[str, Any] = {}
    if _section(env, "varnish", ["TOKENEDGE_VARNISH_PURGE_URL"], ["TOKENEDGE_VARNISH_PURGE_TOKEN"]):
        mode = env.get("TOKENEDGE_VARNISH_PURGE_MODE", "xkey")
        config["varnish"] = VarnishConfig(
            purge_urls=tuple(u.strip() for u in env["TOKENEDGE_VARNISH_PURGE_URL"].split(",") if u.strip()),
            token=env.get("TOKENEDGE_VARNISH_PURGE_TOKEN"),
            mode=cast(Literal["xkey", "ban"], mode),
            soft=soft and mode == "xkey",
            retry=policy,
        )
    if _section(env, "fastly", ["TOKENEDGE_FASTLY_API_TOKEN", "TOKENEDGE_FASTLY_SERVICE_ID"]):
        config["fastly"] = FastlyConfig(
            api_token=env["TOKENEDGE_FASTLY_API_TOKEN"],
            service_id=env["TOKENEDGE_FASTLY_SERVICE_ID"],
            soft=soft,
            retry=policy,
        )
    if _section(env, "cloudflare", ["TOKENEDGE_CLOUDFLARE_API_TOKEN", "TOKENEDGE_CLOUDFLARE_ZONE_ID"]):
        config["cloudflare"] = CloudflareConfig(
            api_token=env["TOKENEDGE_CLOUDFLARE_API_TOKEN"],
            zone_id=env["TOKENEDGE_CLOUDFLARE_ZONE_ID"],
            retry=policy,
        )
    akamai_required = [
        f"TOKENEDGE_AKAMAI_{n}" for n in ("HOST", "CLIENT_TOKEN", "CLIENT_SECRET", "ACCESS_TOKEN")
    ]
    if _section(env, "akamai", akamai_required, ["TOKENEDGE_AKAMAI_NETWORK", "TOKENEDGE_AKAMAI_OPERATION"]):
        config["akamai"] = AkamaiConfig(
            host=env["TOKENEDGE_AKAMAI_HOST"],
            credentials=EdgeGridCredentials(
                client_token=env["TOKENEDGE_AKAMAI_CLIENT_TOKEN"],
                client_secret=env["TOKENEDGE_AKAMAI_CLIENT_SECRET"],
                access_token=env["TOKENEDGE_AKAMAI_ACCESS_TOKEN"],
            ),
            network=cast(Literal["production", "staging"], env.get("TOKENEDGE_AKAMAI_NETWORK", "production")),
            operation=cast(
                Literal["invalidate", "delete"], env.get("TOKENEDGE_AKAMAI_OPERATION", "invalidate")
            ),
            retry=policy,
        )
    return CdnConfig(**config)


def build_purge_clients(
    config: CdnConfig,
    session: aiohttp.ClientSession,
    *,
    sleep: Sleep = asyncio.sleep,
    rng: Uniform | None = None,
) -> list[PurgeClient]:
    """One client per configured CDN, all sharing the caller's session (which the caller closes)."""
    clients: list[PurgeClient] = []
    if config.varnish is not None:
        clients.append(VarnishPurgeClient(config.varnish, session, sleep=sleep, rng=rng))
    if config.fastly is not None:
        clients.append(FastlyPurgeClient(config.fastly, session, sleep=sleep, rng=rng))
    if config.cloudflare is not None:
        clients.append(CloudflarePurgeClient(config.cloudflare, session, sleep=sleep, rng=rng))
    if config.akamai is not None:
        clients.append(AkamaiPurgeClient(config.akamai, session, sleep=sleep, rng=rng))
    return clients


def _section(
    env: Mapping[str, str], name: str, required: list[str], optional: list[str] | None = None
) -> bool:
    present = [v for v in required + (optional or []) if v in env]
    if not present:
        return False
    missing = [v for v in required if v not in env]
    if missing:
        raise ValueError(f"{name} purge is half-configured: missing {', '.join(missing)}")
    return True


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "0").lower()
    if value not in ("0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"{name} must be 0 or 1")
    return value in ("1", "true", "yes")
