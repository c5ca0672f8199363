"""BackendConfig: defaults, then TOKENEDGE_BACKEND_* environment, then CLI flags; invalid values refused."""

from __future__ import annotations

import pytest
import torch

from backend.config import BackendConfig
from backend.engine.config import EngineConfig


def test_defaults_serve_smollm2_on_cpu_in_bf16() -> None:
    config = BackendConfig.from_sources([], environ={})
    assert config.model is None and config.port == 8000 and config.engine.device == "cpu"
    assert config.torch_dtype == torch.bfloat16
    assert config.weights == "quantized"
    assert config.engine.batch_invariant is True
    assert config.engine.speculative_tokens == 3


def test_the_engine_section_is_the_engine_config_with_its_one_set_of_defaults() -> None:
    config = BackendConfig.from_sources([], environ={})
    assert config.engine == EngineConfig() == BackendConfig().engine
    assert config.engine.max_model_len == 4096 and config.engine.num_blocks == 2048


def test_engine_fields_keep_their_flat_flags_and_environment_variables() -> None:
    env = {"TOKENEDGE_BACKEND_MAX_MODEL_LEN": "1024", "TOKENEDGE_BACKEND_NUM_BLOCKS": "256"}
    argv = ["--num-blocks", "128", "--block-size", "32", "--attention", "sdpa", "--speculative-tokens", "0"]
    engine = BackendConfig.from_sources(argv, environ=env).engine
    assert (engine.max_model_len, engine.num_blocks, engine.block_size) == (1024, 128, 32)
    assert (engine.attention, engine.speculative_tokens) == ("sdpa", 0)


def test_cli_overrides_environment() -> None:
    env = {
        "TOKENEDGE_BACKEND_PORT": "9001",
        "TOKENEDGE_BACKEND_DTYPE": "float32",
        "TOKENEDGE_BACKEND_MAX_N": "2",
    }
    config = BackendConfig.from_sources(["--port", "9002", "--threads", "2"], environ=env)
    assert (config.port, config.dtype, config.max_n, config.threads) == (9002, "float32", 2, 2)


def test_batch_invariance_can_be_turned_off_by_flag_or_environment() -> None:
    off = BackendConfig.from_sources(["--batch-invariant", "false"], environ={}).engine
    assert off.batch_invariant is False and off.draft_tokens == 0  # speculation needs invariant kernels
    env = {"TOKENEDGE_BACKEND_BATCH_INVARIANT": "off"}
    assert BackendConfig.from_sources([], environ=env).engine.batch_invariant is False
    assert BackendConfig.from_sources(["--batch-invariant", "on"], environ=env).engine.batch_invariant is True


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
        ("--block-size", "0"),
        ("--speculative-tokens", "-1"),
        ("--num-blocks", "4"),  # the pool cannot hold one sequence of max_model_len
    ],
)
def test_invalid_values_are_refused(flag: str, value: str) -> None:
    with pytest.raises(ValueError):
        BackendConfig.from_sources([flag, value], environ={})
