"""CDN purge clients: one `PurgeClient` interface over Varnish (xkey or ban), Fastly (surrogate keys),
Cloudflare (cache tags) and Akamai (Fast Purge v3 by tag, EdgeGrid-signed), plus `fan_out` to purge them
all at once and the config loader the gateway calls. Tag spelling lives in `cdn.tags`."""

from cdn.purge.akamai import AkamaiConfig, AkamaiPurgeClient
from cdn.purge.base import PurgeClient, PurgeResult
from cdn.purge.cloudflare import CloudflareConfig, CloudflarePurgeClient
from cdn.purge.config import CdnConfig, build_purge_clients, load_cdn_config_from_env
from cdn.purge.edgegrid import EdgeGridCredentials
from cdn.purge.fanout import fan_out
from cdn.purge.fastly import FastlyConfig, FastlyPurgeClient
from cdn.purge.retry import RetryPolicy
from cdn.purge.varnish import VarnishConfig, VarnishPurgeClient

__all__ = [
    "AkamaiConfig",
    "AkamaiPurgeClient",
    "CdnConfig",
    "CloudflareConfig",
    "CloudflarePurgeClient",
    "EdgeGridCredentials",
    "FastlyConfig",
    "FastlyPurgeClient",
    "PurgeClient",
    "PurgeResult",
    "RetryPolicy",
    "VarnishConfig",
    "VarnishPurgeClient",
    "build_purge_clients",
    "fan_out",
    "load_cdn_config_from_env",
]
