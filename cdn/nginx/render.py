"""Render `tokenedge.conf` for a deployment: listen address, the gateway's address, body limit, edge TTL cap.

The config is a template with `{{name}}` slots (nginx's own `$variables` are left alone); every value is
validated here because it is pasted into nginx syntax. Exact-key purge is enabled when the ngx_cache_purge
module (Debian: libnginx-mod-http-cache-purge) is present in `modules_dir`.
Usage: `python -m cdn.nginx.render --backend 127.0.0.1:8080 --prefix /var/lib/tokenedge-nginx > nginx.conf`.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("tokenedge.conf")
JS_DIR = Path(__file__).parent
MODULES_DIR = "/usr/lib/nginx/modules"
PURGE_MODULE = "ngx_http_cache_purge_module.so"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # the gateway's server.max_body_bytes default
_HOST = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}")
_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_HEADER = re.compile(r"[A-Za-z0-9-]{1,64}")
_SLOT = re.compile(r"\{\{([a-z_]+)\}\}")


@dataclass(frozen=True, slots=True)
class NginxEdgeConfig:
    backend: str = "127.0.0.1:8080"  # the gateway, HOST:PORT
    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    prefix: str = "/var/lib/tokenedge-nginx"  # pid, cache and temp paths live here
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # also the in-memory body buffer: bodies never spill to disk
    edge_ttl_s: int = 60  # upper bound on any entry's life at nginx; keep it at or under the routes' ttl_s
    max_cache_bytes: int = 1 << 30
    worker_processes: int = 1
    tenant_header: str = ""  # the gateway's server.tenant_header, hashed in addition to Authorization
    modules_dir: str = MODULES_DIR
    purge: bool | None = None  # None: enable exact-key PURGE when the cache-purge module is installed
    user: str = ""  # worker user when started as root; it must own `prefix` (empty: nginx's default)

    def __post_init__(self) -> None:
        host, _, port = self.backend.rpartition(":")
        if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("nginx edge: backend must be HOST:PORT")
        if not _HOST.fullmatch(self.listen_host) or not 0 < self.listen_port < 65536:
            raise ValueError("nginx edge: listen_host/listen_port are invalid")
        for name in ("prefix", "modules_dir"):
            if not _PATH.fullmatch(getattr(self, name)):
                raise ValueError(f"nginx edge: {name} must be an absolute path of [A-Za-z0-9._/-]")
        if not 1024 <= self.max_body_bytes <= 64 << 20:
            raise ValueError("nginx edge: max_body_bytes must be in 1 KiB..64 MiB (it is held in memory)")
        if not 1 <= self.edge_ttl_s <= 86_400:
            raise ValueError("nginx edge: edge_ttl_s must be in 1..86400")
        if self.max_cache_bytes < 1 << 20 or not 1 <= self.worker_processes <= 256:
            raise ValueError("nginx edge: max_cache_bytes >= 1 MiB and worker_processes in 1..256")
        if self.tenant_header and not _HEADER.fullmatch(self.tenant_header):
            raise ValueError("nginx edge: tenant_header must be a header name")
        if self.user and not _HEADER.fullmatch(self.user):
            raise ValueError("nginx edge: user must be a user name")

    @property
    def purge_enabled(self) -> bool:
        if self.purge is not None:
            return self.purge
        return (Path(self.modules_dir) / PURGE_MODULE).exists()


# ngx_cache_purge 2.3, separate-location syntax (its same-location `PURGE` form crashed the worker with the
# njs key in our lab run): `/tokenedge-purge/v1/cache/{key}` drops `GET /v1/cache/{key}` for the same credential.
_PURGE_LOCATION = """        location ~ ^/tokenedge-purge/v1/cache/[^/]+$ {
            allow 127.0.0.1;
            allow ::1;
            deny all;
            proxy_cache_purge tokenedge $tokenedge_key;
        }
"""


def render(config: NginxEdgeConfig, template: str | None = None) -> str:
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    purge = config.purge_enabled
    tenant_var = "$http_" + config.tenant_header.lower().replace("-", "_") if config.tenant_header else ""
    values = {
        "user": f"user {config.user};" if config.user else "",
        "backend": config.backend,
        "listen_host": config.listen_host,
        "listen_port": str(config.listen_port),
        "prefix": config.prefix.rstrip("/") or "/",
        "max_body_bytes": str(config.max_body_bytes),
        "edge_ttl_s": str(config.edge_ttl_s),
        "max_cache_bytes": str(config.max_cache_bytes),
        "worker_processes": str(config.worker_processes),
        "modules_dir": config.modules_dir,
        "js_dir": str(JS_DIR),
        "tenant_header_var": tenant_var,
        "load_cache_purge": f"load_module {config.modules_dir}/{PURGE_MODULE};" if purge else "",
        "purge_location": _PURGE_LOCATION if purge else "",
    }
    missing = set(_SLOT.findall(text)) - set(values)
    if missing:
        raise ValueError(f"template slots without a value: {', '.join(sorted(missing))}")
    return _SLOT.sub(lambda m: values[m[1]], text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render cdn/nginx/tokenedge.conf")
    parser.add_argument("--backend", default="127.0.0.1:8080", help="gateway HOST:PORT")
    parser.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT to listen on")
    parser.add_argument("--prefix", default="/var/lib/tokenedge-nginx")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--edge-ttl-s", type=int, default=60)
    parser.add_argument("--tenant-header", default="")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    config = NginxEdgeConfig(
        backend=args.backend,
        listen_host=host,
        listen_port=int(port),
        prefix=args.prefix,
        max_body_bytes=args.max_body_bytes,
        edge_ttl_s=args.edge_ttl_s,
        tenant_header=args.tenant_header,
    )
    sys.stdout.write(render(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
