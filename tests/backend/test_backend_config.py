"""BackendConfig: defaults, then TOKENEDGE_BACKEND_* environment, then CLI flags; invalid values refused."""

from __future__ import annotations

import pytest
import torch

from backend.config import BackendConfig


def test_defaults_serve_smollm2_on_cpu_in_bf16() -> None:
    config = BackendConfig.from_sources([], environ={})
    assert config.model is None and config.port == 8000 and config.device == "cpu"
    assert config.torch_dtype == torch.bfloat16
    assert config.weights == "quantized"
    assert config.batch_invariant is True


def test_cli_overrides_environment() -> None:
    env = {
        "TOKENEDGE_BACKEND_PORT": "9001",
        "TOKENEDGE_BACKEND_DTYPE": "float32",
        "TOKENEDGE_BACKEND_MAX_N": "2",
    }
    config = BackendConfig.from_sources(["--port", "9002", "--threads", "2"], environ=env)
    assert (config.port, config.dtype, config.max_n, config.threads) == (9002, "float32", 2, 2)


def test_batch_invariance_can_be_turned_off_by_flag_or_environment() -> None:
    assert BackendConfig.from_sources(["--batch-invariant", "false"], environ={}).batch_invariant is False
    env = {"TOKENEDGE_BACKEND_BATCH_INVARIANT": "off"}
    assert BackendConfig.from_sources([], environ=env).batch_invariant is False
    assert BackendConfig.from_sources(["--batch-invariant", "on"], environ=env).batch_invariant is True


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--dtype", "int8"),
        ("--port", "0"),
        ("--max-n", "0"),
        ("--attention", "magic"),
        ("--threads", "-1"),
        ("--weights", "int3"),
        ("--port", "x"),
        ("--batch-invariant", "maybe"),
    ],
)
def test_invalid_values_are_refused(flag: str, value: str) -> None:
    with pytest.raises(ValueError):
        BackendConfig.from_sources([flag, value], environ={})
