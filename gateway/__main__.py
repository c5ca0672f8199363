"""`python -m gateway` / `tokenedge-gateway`: load config, then serve with one or N worker processes.

With `--workers N` every worker binds the same port with SO_REUSEPORT and the kernel spreads connections; L1 is per
process, L2 (Redis) is shared, and purges reach every worker's L1 over Redis pub/sub, or without Redis through a
relay in this parent process (gateway.coherence). PROMETHEUS_MULTIPROC_DIR is set before any worker imports prometheus_client, so
`/metrics` on any worker reports the totals of all of them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from pathlib import Path

from gateway.coherence.local_bus import LocalBusEnd, LocalHub
from gateway.config import ConfigError, GatewayConfig, load_config


def serve(config: GatewayConfig, *, reuse_port: bool, local_bus: LocalBusEnd | None = None) -> None:
    from aiohttp import web

    from cdn.purge import load_cdn_config_from_env
    from gateway.app import create_app

    if config.server.uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    app = create_app(config, cdn=load_cdn_config_from_env(os.environ), local_bus=local_bus)
    # handler_cancellation: a client that disconnects cancels its handler at once (fills are shielded tasks).
    web.run_app(app, host=config.server.host, port=config.server.port, reuse_port=reuse_port,
                handler_cancellation=True,
                access_log=None, print=None, handle_signals=True)


def _worker(config: GatewayConfig, local_bus: LocalBusEnd | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    serve(config, reuse_port=True, local_bus=local_bus)


def run_workers(config: GatewayConfig) -> int:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="tokenedge-metrics-")
    else:
        for stale in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob("*.db"):
            stale.unlink()
    ctx = multiprocessing.get_context("spawn")
    # Under `python -m gateway` this module is `__main__`, which spawn does not re-import in the child
    # (multiprocessing skips `*.__main__`), so the target must come from the importable module name.
    target = importlib.import_module("gateway.__main__")._worker
    # Without Redis the workers' L1s stay coherent through the parent: it relays every purge between them.
    hub = None if config.cache.redis_url else LocalHub(config.server.workers)
    procs = [ctx.Process(target=target, args=(config, hub.worker_ends[i] if hub else None),
                         name=f"tokenedge-worker-{i}", daemon=False)
             for i in range(config.server.workers)]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenedge-gateway", description=__doc__)
    parser.add_argument("--config", default=os.environ.get("TOKENEDGE_CONFIG"), help="TOML config file")
    parser.add_argument("--workers", type=int, help="worker processes (overrides server.workers)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    for flag, name in (("workers", "WORKERS"), ("host", "HOST"), ("port", "PORT")):
        if getattr(args, flag) is not None:
            env[f"TOKENEDGE_SERVER_{name}"] = str(getattr(args, flag))
    try:
        config = load_config(args.config, env)
    except ConfigError as exc:
        print(f"tokenedge-gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    logging.getLogger("tokenedge.gateway").info(
        "gateway on http://%s:%d -> %s (%d worker(s), L1 %d MiB, L2 %s)", config.server.host, config.server.port,
        config.upstream.url, config.server.workers, config.cache.l1_max_bytes >> 20,
        "redis" if config.cache.redis_url else "off")
    if config.server.workers > 1:
        return run_workers(config)
    serve(config, reuse_port=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
