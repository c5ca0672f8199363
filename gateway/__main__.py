"""`python -m gateway` / `tokenedge-gateway`: load config, then serve with one or N worker processes.

With `--workers N` every worker binds the same port with SO_REUSEPORT and the kernel spreads connections; L1 is per
process, L2 (Redis) is shared, and purges reach every worker's L1 over Redis pub/sub, or without Redis through a
relay in this parent process (gateway.tiers.coherence). PROMETHEUS_MULTIPROC_DIR is set before any worker imports prometheus_client, so
`/metrics` on any worker reports the totals of all of them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import assert_never

from gateway.config.sections import CacheConfig
from gateway.config.settings import ConfigError, GatewayConfig, load_config
from gateway.tiers.coherence.local_bus import LocalBusEnd, LocalHub

PROG = "tokenedge-gateway"
_FLAGS = {
    "workers": "TOKENEDGE_SERVER_WORKERS",
    "host": "TOKENEDGE_SERVER_HOST",
    "port": "TOKENEDGE_SERVER_PORT",
}


def l2_description(cache: CacheConfig) -> str:
    """The start-up line's name for the shared tier in use (`CacheConfig.l2_kind`, which `cache.l2` may pin)."""
    match cache.l2_kind:
        case "redis":
            return "redis cluster" if "+cluster://" in cache.redis_url else "redis"
        case "memcached":
            count = len(cache.memcached_servers)
            return f"memcached ({count} server{'s' if count != 1 else ''})"
        case "":
            return "off"
        case _ as unreachable:
            assert_never(unreachable)


def check_bind(host: str, port: int) -> None:
    """Fail with one line, before any worker starts, when `host:port` cannot be bound (in use, unresolvable)."""
    where = f"server.host/server.port {host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve {where}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as aiohttp does: TIME_WAIT is no conflict
        try:
            sock.bind(address)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {where}: {exc.strerror or exc}") from None


def serve(config: GatewayConfig, *, reuse_port: bool, local_bus: LocalBusEnd | None = None) -> None:
    from cdn.purge import load_cdn_config_from_env
    from gateway.app import create_app
    from gateway.edge.server import serve as serve_edge

    if config.server.uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    app = create_app(config, cdn=load_cdn_config_from_env(os.environ), local_bus=local_bus)
    # handler_cancellation (set by serve_edge): a client that disconnects cancels its handler at once (fills are
    # shielded tasks). The edge adds read deadlines and the connection cap (gateway.edge.server).
    try:
        serve_edge(app, config.server, reuse_port=reuse_port)  # drains on SIGTERM (gateway.edge.drain)
    except OSError as exc:  # lost a race after check_bind: still one line, never a traceback
        print(
            f"{PROG}: configuration error: cannot listen on {config.server.host}:{config.server.port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        sys.exit(2)


def _worker(config: GatewayConfig, local_bus: LocalBusEnd | None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    )
    serve(config, reuse_port=True, local_bus=local_bus)


def run_workers(config: GatewayConfig) -> int:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="tokenedge-metrics-")
    else:
        for pattern in ("*.db", "hotkeys_*.json"):  # a previous run's counters and dashboard tables
            for stale in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob(pattern):
                stale.unlink()
    ctx = multiprocessing.get_context("spawn")
    # Under `python -m gateway` this module is `__main__`, which spawn does not re-import in the child
    # (multiprocessing skips `*.__main__`), so the target must come from the importable module name.
    target = importlib.import_module("gateway.__main__")._worker
    # Without Redis the workers' L1s stay coherent through the parent: it relays every purge between them.
    hub = None if config.cache.redis_url else LocalHub(config.server.workers)
    procs = [
        ctx.Process(
            target=target,
            args=(config, hub.worker_ends[i] if hub else None),
            name=f"tokenedge-worker-{i}",
            daemon=False,
        )
        for i in range(config.server.workers)
    ]
    for proc in procs:
        proc.start()
    if hub is not None:
        hub.start()

    def stop(_signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    for proc in procs:
        proc.join()
        code = code or (proc.exitcode or 0)
    return 0 if code in (0, -signal.SIGTERM) else code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every setting can also be set as TOKENEDGE_{SECTION}_{SETTING} (e.g. TOKENEDGE_CACHE_REDIS_URL, "
        "TOKENEDGE_ROUTES_CHAT_COMPLETIONS_TTL_S); configs/gateway.toml lists them all. Precedence: "
        "flags, then the environment, then the file, then the defaults.",
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("TOKENEDGE_CONFIG"),
        metavar="PATH",
        help="TOML config file (default: $TOKENEDGE_CONFIG, else the embedded defaults)",
    )
    parser.add_argument(
        "--workers", type=int, help="worker processes sharing the port (overrides server.workers)"
    )
    parser.add_argument("--host", help="address to listen on (overrides server.host)")
    parser.add_argument("--port", type=int, help="port to listen on (overrides server.port)")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective config as TOML, with each value's source, and exit",
    )
    parser.add_argument(
        "--print-url",
        action="store_true",
        help="print the URL the gateway would listen on (http://HOST:PORT) and exit",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [
        "warm"
    ]:  # `python -m gateway warm --top N`: re-ask the hottest requests (gateway/misses/reask.py)
        from gateway.misses import reask

        return reask.main(argv[1:], dict(os.environ))
    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    flags = {name: f"--{flag}" for flag, name in _FLAGS.items() if getattr(args, flag) is not None}
    for flag, name in _FLAGS.items():
        if getattr(args, flag) is not None:
            env[name] = str(getattr(args, flag))
    sources: dict[str, str] = {}
    try:
        config = load_config(args.config, env, sources=sources)
        if not (args.print_config or args.print_url):
            check_bind(config.server.host, config.server.port)
    except ConfigError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        from gateway.config.show import render

        for setting, origin in sources.items():
            name = origin.removeprefix("env ")
            sources[setting] = f"flag {flags[name]}" if name in flags else origin
        sys.stdout.write(render(config, sources))
        return 0
    if args.print_url:
        host = config.server.host
        print(
            f"http://{f'[{host}]' if ':' in host else host}:{config.server.port}"
        )  # RFC 3986: IPv6 in brackets
        return 0
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("tokenedge.gateway").info(
        "gateway on http://%s:%d -> %s (%d worker(s), L1 %d MiB, L2 %s)",
        config.server.host,
        config.server.port,
        ", ".join(t.url for t in config.upstream.targets),
        config.server.workers,
        config.cache.l1_max_bytes >> 20,
        l2_description(config.cache),
    )
    if config.server.workers > 1:
        return run_workers(config)
    serve(config, reuse_port=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
