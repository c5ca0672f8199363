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


def test_cli_overrides_environment() -> None:
    env = {
        "TOKENEDGE_BACKEND_PORT": "9001",
        "TOKENEDGE_BACKEND_DTYPE": "float32",
        "TOKENEDGE_BACKEND_MAX_N": "2",
    }
    config = BackendConfig.from_sources(["--port", "9002", "--threads", "2"], environ=env)
    assert (config.port, config.dtype, config.max_n, config.threads) == (9002, "float32", 2, 2)


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
    ],
)
def test_invalid_values_are_refused(flag: str, value: str) -> None:
    with pytest.raises(ValueError):
        BackendConfig.from_sources([flag, value], environ={})
