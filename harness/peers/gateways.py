"""The peers the gateway is measured against, each started on a loopback port: bare aiohttp, nginx and the
LiteLLM proxy (in its own venv under bench/.venv-litellm: a peer, never a dependency).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.processes import PYTHON, ROOT, free_port, server

LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
LITELLM_MASTER_KEY = "sk-bench-master"


@contextmanager
def bare_aiohttp(body: bytes, workers: int) -> Iterator[tuple[str, list[int]]]:
    body_file = Path(tempfile.mkstemp(suffix=".json")[1])
    body_file.write_bytes(body)
    port = free_port()
    # One process starts all N workers, as the gateway does: one session, so one Linux autogroup. (Started apart, each
    # worker had a session and a scheduler share of its own: on a loaded machine, twice the gateway's CPU at N=2.)
    argv = [
        PYTHON,
        "-m",
        "harness.peers.servers",
        "bare",
        str(port),
        str(body_file),
        "--workers",
        str(workers),
    ]
    with server(argv, f"http://127.0.0.1:{port}/health") as proc:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", [proc.pid]


def _nginx_escape(body: bytes) -> str:
    return body.decode().replace("\\", "\\\\").replace("'", "\\'")


@contextmanager
def nginx_fixed(body: bytes, workers: int) -> Iterator[tuple[str, list[int]]]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    prefix = Path(tempfile.mkdtemp(prefix="tokenedge-bench-nginx-"))
    (prefix / "logs").mkdir()
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location = /health {{ return 200 'ok'; }}
    location / {{ default_type application/json; return 200 '{_nginx_escape(body)}'; }}
  }}
}}
""")
    with server([binary, "-p", str(prefix), "-c", str(conf)], f"http://127.0.0.1:{port}/health") as proc:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", [proc.pid]


def ensure_litellm() -> Path | None:
    """The LiteLLM proxy binary, installing it into its own venv on first use; None if it cannot be had."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        subprocess.run([PYTHON, "-m", "venv", str(LITELLM_VENV)], check=True)
        result = subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            print(f"LiteLLM could not be installed; skipping it:\n{result.stderr[-2000:]}")
            return None
    return binary


@contextmanager
def litellm_proxy(
    upstream_url: str, cache: str, redis_url: str | None, workers: int
) -> Iterator[tuple[str, list[int]]]:
    binary = ensure_litellm()
    if binary is None:
        raise RuntimeError("litellm unavailable")
    port = free_port()
    cfg = Path(tempfile.mkstemp(suffix=".yaml")[1])
    cache_params = "    type: local\n"
    if cache == "redis" and redis_url:
        host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
        host, _, rport = host_port.partition(":")
        cache_params = f"    type: redis\n    host: {host}\n    port: {rport}\n"
    cfg.write_text(f"""model_list:
  - model_name: bench-model
    litellm_params:
      model: openai/bench-model
      api_base: {upstream_url}/v1
      api_key: sk-upstream
litellm_settings:
  cache: true
  cache_params:
{cache_params}general_settings:
  master_key: {LITELLM_MASTER_KEY}
""")
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
        "LITELLM_TELEMETRY": "False",
    }
    argv = [
        str(binary),
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        str(workers),
    ]
    with server(
        argv, f"http://127.0.0.1:{port}/health/liveliness", env={**os.environ, **env}, ready_timeout_s=180
    ) as proc:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", [proc.pid]
