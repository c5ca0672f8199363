#!/usr/bin/env bash
# `make run`: the backend (SmolLM2 on CPU, :8000) and the gateway (:8080, in-process cache) together; it prints
# the ports actually used.
# One Ctrl-C stops both. Override with TOKENEDGE_* variables (see README), e.g. TOKENEDGE_CACHE_REDIS_URL.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
trap stop INT TERM EXIT
CONFIG="${TOKENEDGE_CONFIG:-configs/gateway.toml}"
# The gateway's real address (file + TOKENEDGE_* environment); a config error stops here, before anything runs.
gateway_url="$("$PY" -m gateway --config "$CONFIG" --print-url)" || exit 2
"$PY" -m backend --host 127.0.0.1 --port "${TOKENEDGE_BACKEND_PORT:-8000}" &
pids+=($!)
"$PY" -m gateway --config "$CONFIG" &
pids+=($!)
echo "tokenedge: gateway $gateway_url -> backend http://127.0.0.1:${TOKENEDGE_BACKEND_PORT:-8000} (Ctrl-C stops both)"
wait -n
stop
