"""The GPU check (harness/gpu/check.py, harness/gpu/speed.py, harness/gpu/check.sh) without a GPU: its dry mode
runs every step that needs no device on the CPU and writes the JSON; its engines fit the model they run; its shell script
passes over a Python whose torch sees no CUDA device (the project's .venv has the CPU wheel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported: the dry run interprets the kernel

import pytest
import torch

from backend.engine.llm_engine import LLMEngine
from harness.gpu import check as gpu_check
from harness.gpu.speed import speed_config, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_checks_kernels_and_engine_and_writes_one_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dry"] is True and report["failures"] == []
    names = [check["name"] for check in report["checks"]]
    assert sum(name.startswith("triton == reference") for name in names) == len(gpu_check.DRY_CASES)
    assert any(name.startswith("engine torch.float32 triton block 16 == reference_logits") for name in names)
    assert all(check["ok"] for check in report["checks"])
    (row,) = report["speed"]
    assert row["model"] == "tiny" and row["engine_tok_s"] > 0
    assert report["cuda_graphs"].startswith("captured through the CPU seam")
    assert any(name.startswith("cuda graphs decode == eager") for name in names)


def test_a_failed_check_is_named_and_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation check of the dry run: a kernel that answers wrong must turn the exit code and the JSON."""
    monkeypatch.setattr(gpu_check, "reference_paged_attention", lambda q, *_: torch.zeros_like(q))
    monkeypatch.setattr(gpu_check, "check_engine", lambda *_: None)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry", "--out", str(out)]) == 1
    failures = json.loads(out.read_text())["failures"]
    assert len(failures) == len(gpu_check.DRY_CASES) and failures[0].startswith("triton == reference")


@pytest.mark.parametrize("batch, new_tokens", [(1, 128), (32, 128), (32, 900)])
def test_the_speed_engines_fit_the_tiny_model(batch: int, new_tokens: int) -> None:
    """The check used max_model_len=2048 on the tiny model's 1024 positions: a ValueError before any number."""
    model = tiny_model(torch.float32, "cpu")
    config = speed_config(
        model.config.max_position_embeddings, batch=batch, new_tokens=new_tokens, block_size=16, device="cpu",
        attention="sdpa", batch_invariant=False,
    )  # fmt: skip
    assert config.max_model_len <= model.config.max_position_embeddings
    assert config.num_blocks * config.block_size >= batch * config.max_model_len
    LLMEngine(model, config, frozenset())  # raises where the context exceeds the model's


def test_a_run_longer_than_the_model_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="1024 positions"):
        speed_config(1024, batch=1, new_tokens=1000, block_size=16, device="cpu")


def test_without_a_cuda_device_the_check_says_so_and_exits_2() -> None:
    assert not torch.cuda.is_available()
    assert gpu_check.main(["--out", os.devnull]) == 2


def test_the_script_passes_over_a_python_whose_torch_sees_no_gpu() -> None:
    """It preferred .venv/bin/python, which `make` builds with the CPU torch: "no CUDA device" on any GPU machine."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "harness/gpu/check.sh", "--which-python"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert f"{sys.executable}: torch {torch.__version__} sees no CUDA device" in done.stderr
    dry = subprocess.run(
        ["bash", "harness/gpu/check.sh", "--dry", "--which-python"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0 and dry.stdout.strip() == sys.executable


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_kernel_and_engine_checks_pass(tmp_path: Path) -> None:
    """The compiled kernel (not the interpreter: a process without TRITON_INTERPRET) against the reference and the
    engine on it; the speed steps are left to harness/gpu/check.sh (`--budget-s 0` skips them)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "gpu_check.json"
    command = [
        sys.executable,
        "-m",
        "harness.gpu.check",
        "--no-smollm2",
        "--budget-s",
        "0",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(out.read_text())["failures"] == []
