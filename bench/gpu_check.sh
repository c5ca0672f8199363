#!/usr/bin/env bash
# GPU check for the backend: paged flash attention vs the SDPA reference, then decode tokens/s.
# Usage (on a CUDA machine, repo root): bash bench/gpu_check.sh [--no-smollm2]
# Exits non-zero when a check fails. Tries to install flash-attn first if it is missing (failure tolerated:
# the SDPA torch-flash path is still checked).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import flash_attn" 2>/dev/null; then
    echo "flash-attn missing: trying pip install flash-attn --no-build-isolation (may fail; tolerated)"
    "$PY" -m pip install -q flash-attn --no-build-isolation || echo "flash-attn install failed; continuing without it"
fi
exec "$PY" -m bench.gpu_check "$@"
