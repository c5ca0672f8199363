"""The environment variables the CDN purge clients read (cdn.purge.config), listed once so the gateway's config can
tell them from a misspelled setting: an unknown `TOKENEDGE_*` variable stops the gateway (gateway.config.settings)."""

from __future__ import annotations

CDN_ENV_NAMES: tuple[str, ...] = (
    "TOKENEDGE_VARNISH_PURGE_URL",
    "TOKENEDGE_VARNISH_PURGE_TOKEN",
    "TOKENEDGE_VARNISH_PURGE_MODE",
    "TOKENEDGE_FASTLY_API_TOKEN",
    "TOKENEDGE_FASTLY_SERVICE_ID",
    "TOKENEDGE_CLOUDFLARE_API_TOKEN",
    "TOKENEDGE_CLOUDFLARE_ZONE_ID",
    "TOKENEDGE_AKAMAI_HOST",
    "TOKENEDGE_AKAMAI_CLIENT_TOKEN",
    "TOKENEDGE_AKAMAI_CLIENT_SECRET",
    "TOKENEDGE_AKAMAI_ACCESS_TOKEN",
    "TOKENEDGE_AKAMAI_NETWORK",
    "TOKENEDGE_AKAMAI_OPERATION",
    "TOKENEDGE_CDN_SOFT_PURGE",
)
