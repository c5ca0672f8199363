"""harness/peers/llamacpp_formats.py without compiling: the peer's format is the one llama-bench measures fastest at the
thread count compared (decode first, prefill breaking ties), the shipped file is never requantized, a requantized
file is made once with `--allow-requantize`, and llama-bench's JSON rows map back to their formats. The binaries
are stand-in scripts that record their arguments; the real ones run in `python -m bench backend`."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from harness.models.random_gguf import Shape, write_random_gguf
from harness.peers import llamacpp_build
from harness.peers.llamacpp_build import LlamaBuild
from harness.peers.llamacpp_formats import (
    FormatRate,
    bench_rows,
    fastest,
    format_table,
    requantized,
    shipped_format,
)


def fake_build(tmp_path: Path, quantize: str = "", bench: str = "") -> LlamaBuild:
    directory = tmp_path / "build-key"
    directory.mkdir(exist_ok=True)
    for name, body in (("llama-quantize", quantize), ("llama-bench", bench)):
        script = directory / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return LlamaBuild(directory, "b1", "g++", "cpu", (), "avx2", 0.0)


def rate(fmt: str, threads: int, pp: float, tg: float) -> FormatRate:
    return FormatRate(fmt, threads, pp, tg, Path(f"/m.{fmt}.gguf"))


def test_the_fastest_format_is_the_best_decoder_at_that_thread_count() -> None:
    rows = [
        rate("Q4_1", 1, 150, 77),
        rate("Q4_0", 1, 490, 125),
        rate("Q4_K_M", 1, 300, 125),  # the same decode: Q4_0's prefill breaks the tie
        rate("Q4_1", 2, 250, 150),  # fastest at 2 threads only
        rate("Q4_0", 2, 800, 142),
    ]
    assert fastest(rows, 1).format == "Q4_0" and fastest(rows, 2).format == "Q4_1"
    table = format_table(rows, "Q4_1", "AMD EPYC")
    assert "AMD EPYC" in table
    assert [ln.split()[0] for ln in table.splitlines() if "fastest" in ln] == ["Q4_0", "Q4_1"]
    assert [ln.split()[:2] for ln in table.splitlines() if "shipped" in ln] == [["Q4_1", "1"], ["Q4_1", "2"]]


def test_requantizing_runs_llama_quantize_once_and_never_on_the_shipped_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llamacpp_build.CACHE_ENV, str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    build = fake_build(tmp_path, quantize=f'echo "$@" >> {calls}; cp "$2" "$3"')
    model = write_random_gguf(Shape("toy", 64, 1, 2, 1, 128, 49152, 1e4), tmp_path / "toy.gguf", "Q4_1")
    assert shipped_format(model) == "Q4_1"
    assert requantized(build, model, "Q4_1") == model and not calls.exists()
    first = requantized(build, model, "Q4_0")
    again = requantized(build, model, "Q4_0")
    assert first == again and first.exists() and first.name.endswith(".Q4_0.gguf")
    (argv,) = calls.read_text().splitlines()
    assert argv.split()[0] == "--allow-requantize" and argv.split()[-1] == "Q4_0"


def test_llama_bench_rows_map_back_to_their_formats(tmp_path: Path) -> None:
    files = {"Q4_0": tmp_path / "a.gguf", "Q4_1": tmp_path / "b.gguf"}
    rows = [
        {
            "model_filename": str(files[f]),
            "n_threads": t,
            "n_prompt": p,
            "n_gen": 32 if not p else 0,
            "avg_ts": v,
        }
        for f, t, p, v in (
            ("Q4_0", 1, 128, 500.0),
            ("Q4_0", 1, 0, 125.0),
            ("Q4_1", 1, 128, 150.0),
            ("Q4_1", 1, 0, 77.0),
        )
    ]
    args = tmp_path / "args"
    build = fake_build(tmp_path, bench=f"echo \"$@\" > {args}; cat <<'EOF'\n{json.dumps(rows)}\nEOF")
    got = sorted(bench_rows(build, files, [1, 2]), key=lambda r: r.format)
    assert [(r.format, r.threads, r.pp_tok_s, r.tg_tok_s) for r in got] == [
        ("Q4_0", 1, 500.0, 125.0),
        ("Q4_1", 1, 150.0, 77.0),
    ]
    argv = args.read_text().split()
    assert argv[argv.index("-t") + 1] == "1,2" and argv.count("-m") == 2
