"""requirements.lock pins every dependency pyproject.toml declares (the base and the backend and dev extras) to one
version inside the declared range, so a fresh machine installs what CI tested (`make lock` rewrites it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_declared_dependency_is_pinned_inside_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["backend"]]
    declared += project["optional-dependencies"]["dev"]
    pins = locked()
    problems = []
    for spec in map(Requirement, declared):
        name = canonicalize_name(spec.name)
        if name == "torch":
            continue  # pinned by the Makefile to the CPU wheel
        if name not in pins:
            problems.append(f"{spec.name} is not in requirements.lock")
        elif pins[name] not in spec.specifier:
            problems.append(f"{spec.name}=={pins[name]} is outside {spec.specifier}")
    assert problems == []


def test_aiohttp_is_locked_at_the_floor_the_seam_is_tested_on() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "aiohttp"]
    floor = next(Version(s.version) for s in spec.specifier if s.operator == ">=")
    assert locked()["aiohttp"] == floor
