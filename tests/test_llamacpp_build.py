"""harness/peers/llamacpp_build.py without compiling: a cached build is a directory lookup, a missing toolchain
is an error that names the tool (the suite's llama-server fixture then fails with it, never skips)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.peers import llamacpp_build
from harness.peers.llamacpp_build import BuildUnavailable, build_key, ensure_build


def test_a_cached_build_is_returned_without_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llamacpp_build.CACHE_ENV, str(tmp_path))
    target = tmp_path / build_key()
    target.mkdir()
    info = {
        "version": "b1",
        "compiler": "g++ 12",
        "cpu": "c",
        "cmake_args": ["-DX=1"],
        "isa": "avx2",
        "build_s": 9,
    }
    (target / "build.json").write_text(json.dumps(info))

    def refuse(_target: Path) -> None:
        raise AssertionError("a cached build was compiled again")

    monkeypatch.setattr(llamacpp_build, "_build_into", refuse)
    build = ensure_build()

    assert build.server == target / "llama-server" and build.bench == target / "llama-bench"
    assert build.quantize == target / "llama-quantize"
    assert build.version == "b1" and build.cmake_args == ("-DX=1",)
    assert "b1" in build.describe() and target.name in build.describe()


def test_the_key_changes_with_the_patch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other.patch"
    other.write_text(llamacpp_build.PATCH.read_text() + "\n")
    before = build_key()
    monkeypatch.setattr(llamacpp_build, "PATCH", other)

    assert build_key() != before


def test_the_key_changes_with_the_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache built before llama-quantize was a target holds no llama-quantize: it must not be found again."""
    assert "llama-quantize" in llamacpp_build.TARGETS
    before = build_key()
    monkeypatch.setattr(llamacpp_build, "TARGETS", ("llama-server", "llama-bench"))

    assert build_key() != before


def test_a_missing_compiler_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llamacpp_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, g++ or cmake here

    with pytest.raises(BuildUnavailable, match="gcc is missing"):
        ensure_build()
