#!/usr/bin/env bash
# The GPU check (harness/gpu/check.py) on a rented CUDA machine, in one run of a few minutes; writes one JSON.
#
# It runs on the machine's own python3 and its CUDA torch: the project's .venv holds the CPU torch wheel (`make`
# installs it), so a Python whose torch sees no GPU is passed over. The project's packages that such a machine
# lacks (the loader's gguf, the tokenizer's tiktoken, ...) come as wheels fetched beforehand on a machine with
# network, at the lock's versions, and are installed --no-deps into .tokenedge/gpu-site (no network needed there):
#   bash harness/gpu/check.sh --fetch-wheels          # here: wheels for CPython 3.10-3.13 into .tokenedge/gpu-wheels
#   bash harness/gpu/check.sh [--no-smollm2] [--model X.gguf] [--out gpu_check.json]   # there
#   bash harness/gpu/check.sh --which-python          # the Python it would use, or why none
#   bash harness/gpu/check.sh --dry                   # the CPU steps (any Python with torch, Triton interpreted)
# Exits non-zero when a check fails, and 2 when no Python here has a CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.tokenedge/gpu-wheels
SITE=.tokenedge/gpu-site
# module:package, for what the check imports beyond torch and the standard library
NEEDED="gguf:gguf safetensors:safetensors tiktoken:tiktoken jinja2:jinja2 markupsafe:markupsafe tqdm:tqdm yaml:pyyaml
numpy:numpy regex:regex requests:requests orjson:orjson llguidance:llguidance typing_extensions:typing-extensions
triton:triton"

pinned() {  # the lock's `name==version` of a package
    grep -i "^$1==" requirements.lock | cut -d' ' -f1
}

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p "$WHEELS"
    for pair in $NEEDED; do
        spec=$(pinned "${pair#*:}")
        for version in 3.10 3.11 3.12 3.13; do
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
                --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
                -d "$WHEELS" "$spec" || echo "no $spec wheel for CPython $version"
        done
    done
    ls "$WHEELS"
    exit 0
fi

probe() {  # $1: a python; $2: "cuda" to need a CUDA device. Exit 0 if usable, else a line on why
    "$1" -c "import sys, torch
ok = '$2' != 'cuda' or torch.cuda.is_available()
sys.exit(0 if ok else 'torch ' + torch.__version__ + ' sees no CUDA device')" 2>&1 >/dev/null | tail -1
    return "${PIPESTATUS[0]}"
}

pick_python() {  # the first candidate whose torch is usable ($1: cuda or any); a line on stderr per refusal
    local tried=" "
    for candidate in ${PYTHON:-} python3 .venv/bin/python; do
        found=$(command -v "$candidate" 2>/dev/null) || { echo "$candidate: not found" >&2; continue; }
        found=$(realpath -s "$found")
        case "$tried" in *" $found "*) continue ;; esac
        tried="$tried$found "
        if why=$(probe "$found" "$1"); then
            echo "$found"
            return 0
        fi
        echo "$found: ${why:-no torch}" >&2
    done
    return 1
}

mode=cuda
which=no
args=()
for arg in "$@"; do
    case "$arg" in
        --which-python) which=yes ;;
        --dry) mode=any && args+=("$arg") ;;
        *) args+=("$arg") ;;
    esac
done
if ! PY=$(pick_python "$mode"); then
    echo "no Python here has a CUDA torch: nothing to check (--dry runs the CPU steps)" >&2
    exit 2
fi
if [ "$which" = yes ]; then
    echo "$PY"
    exit 0
fi
missing=()
for pair in $NEEDED; do
    PYTHONPATH="$SITE" "$PY" -c "import ${pair%%:*}" 2>/dev/null || missing+=("$(pinned "${pair#*:}")")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing into $SITE from $WHEELS: ${missing[*]}"
    "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" --target "$SITE" "${missing[@]}"
fi
echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m harness.gpu.check ${args[@]+"${args[@]}"}
