"""Render `tokenedge.vcl` for a deployment: the gateway's address, the body limit, purge auth, stream handling.

The VCL is a template with `{{name}}` slots so tests and operators inject ports and secrets without editing it;
every value is validated here, because a value pasted into VCL is code (a quote in a token would end the string).
Usage: `python -m cdn.varnish.render --backend 127.0.0.1:8080 [--max-body-bytes N] [--purge-acl CIDR ...]
[--tenant-header NAME] [--cache-streams] > /etc/varnish/default.vcl`, token from `TOKENEDGE_VARNISH_PURGE_TOKEN`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("tokenedge.vcl")
_HOST = re.compile(r"[A-Za-z0-9.:-]{1,253}")
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
_HEADER = re.compile(r"[A-Za-z0-9-]{1,64}")
_SLOT = re.compile(r"\{\{([a-z_]+)\}\}")
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # the gateway's server.max_body_bytes default


@dataclass(frozen=True, slots=True)
class VarnishEdgeConfig:
    backend_host: str = "127.0.0.1"
    backend_port: int = 8080
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # keep equal to the gateway's server.max_body_bytes
    purge_token: str | None = None  # when set, PURGE/BAN also need `X-Purge-Token: <token>`
    purge_acl: tuple[str, ...] = ()  # networks allowed to purge besides loopback, e.g. "10.0.0.0/8"
    tenant_header: str = ""  # the gateway's server.tenant_header, hashed in addition to Authorization
    cache_streams: bool = False  # True: `stream: true` bodies are looked up like others (see cdn/README.md)

    def __post_init__(self) -> None:
        if not _HOST.fullmatch(self.backend_host):
            raise ValueError("varnish edge: backend_host must be a host name or IP address")
        if not 0 < self.backend_port < 65536:
            raise ValueError("varnish edge: backend_port must be 1-65535")
        if not 1024 <= self.max_body_bytes <= 1 << 30:
            raise ValueError("varnish edge: max_body_bytes must be in 1 KiB..1 GiB")
        if self.purge_token is not None and not _TOKEN.fullmatch(self.purge_token):
            raise ValueError("varnish edge: purge_token must be 16-256 characters of [A-Za-z0-9._~+/=-]")
        for network in self.purge_acl:
            ipaddress.ip_network(network, strict=False)  # raises ValueError on anything else
        if self.tenant_header and not _HEADER.fullmatch(self.tenant_header):
            raise ValueError("varnish edge: tenant_header must be a header name")

    def __repr__(self) -> str:
        token = "***" if self.purge_token else None
        return (
            f"VarnishEdgeConfig(backend={self.backend_host}:{self.backend_port}, max_body_bytes="
            f"{self.max_body_bytes}, purge_token={token!r}, purge_acl={self.purge_acl!r}, "
            f"tenant_header={self.tenant_header!r}, cache_streams={self.cache_streams})"
        )


def render(config: VarnishEdgeConfig, template: str | None = None) -> str:
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    acl = "".join(_acl_entry(n) for n in config.purge_acl)
    check = ""
    if config.purge_token:
        check = (
            f'    if (req.http.X-Purge-Token != "{config.purge_token}") {{\n'
            '        return (synth(403, "Forbidden"));\n    }\n'
        )
    tenant = (
        f'        hash_data("tenant:" + req.http.{config.tenant_header});\n' if config.tenant_header else ""
    )
    values = {
        "backend_host": config.backend_host,
        "backend_port": str(config.backend_port),
        "max_body_bytes": str(config.max_body_bytes),
        "purge_acl": acl.rstrip("\n"),
        "purge_token_check": check.rstrip("\n"),
        "tenant_hash": tenant.rstrip("\n"),
        "stream_bypass": "false" if config.cache_streams else "true",
    }
    return _fill(text, values)


def _acl_entry(network: str) -> str:
    net = ipaddress.ip_network(network, strict=False)
    return f'    "{net.network_address}"/{net.prefixlen};\n'


def _fill(text: str, values: dict[str, str]) -> str:
    missing = set(_SLOT.findall(text)) - set(values)
    if missing:
        raise ValueError(f"template slots without a value: {', '.join(sorted(missing))}")
    return _SLOT.sub(lambda m: values[m[1]], text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render cdn/varnish/tokenedge.vcl")
    parser.add_argument("--backend", default="127.0.0.1:8080", help="gateway HOST:PORT")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--purge-acl", action="append", default=[], help="extra network allowed to purge")
    parser.add_argument("--tenant-header", default="")
    parser.add_argument("--cache-streams", action="store_true")
    args = parser.parse_args(argv)
    host, _, port = args.backend.rpartition(":")
    config = VarnishEdgeConfig(
        backend_host=host or "127.0.0.1",
        backend_port=int(port),
        max_body_bytes=args.max_body_bytes,
        purge_token=os.environ.get("TOKENEDGE_VARNISH_PURGE_TOKEN") or None,
        purge_acl=tuple(args.purge_acl),
        tenant_header=args.tenant_header,
        cache_streams=args.cache_streams,
    )
    sys.stdout.write(render(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
