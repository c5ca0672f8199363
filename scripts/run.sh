#!/usr/bin/env bash
# `make run`: the backend (SmolLM2 on CPU, :8000) and the gateway (:8080, in-process cache) together; it prints
# the ports actually used.
# One Ctrl-C stops both. Override with TOKENEDGE_* variables (see README), e.g. TOKENEDGE_CACHE_REDIS_URL.
#
# Stopping: Ctrl-C signals the terminal's whole process group (this shell and both servers); a supervisor's
# SIGTERM, or `kill -INT`, reaches only this shell. Either way the shell sends each server one SIGTERM (both
# shut down gracefully on it, as on SIGINT), waits for both, and exits 128 + the signal's number. If one server
# exits on its own, the other is stopped the same way and the script exits with the first one's status.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
pids=()
stop() {
  trap - INT TERM EXIT
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT
CONFIG="${TOKENEDGE_CONFIG:-configs/gateway.toml}"
# A backend on another port: the gateway asks it (unless its upstream is given explicitly).
if [[ -n "${TOKENEDGE_BACKEND_PORT:-}" && -z "${TOKENEDGE_UPSTREAM_URL:-}" ]]; then
  export TOKENEDGE_UPSTREAM_URL="http://127.0.0.1:${TOKENEDGE_BACKEND_PORT}"
fi
# The gateway's real address (file + TOKENEDGE_* environment); a config error stops here, before anything runs.
gateway_url="$("$PY" -m gateway --config "$CONFIG" --print-url)" || exit 2
"$PY" -m backend --host 127.0.0.1 --port "${TOKENEDGE_BACKEND_PORT:-8000}" &
pids+=($!)
"$PY" -m gateway --config "$CONFIG" &
pids+=($!)
echo "tokenedge: gateway $gateway_url -> backend http://127.0.0.1:${TOKENEDGE_BACKEND_PORT:-8000} (Ctrl-C stops both)"
wait -n
status=$?
stop
exit "$status"
