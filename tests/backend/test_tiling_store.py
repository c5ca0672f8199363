"""The row tilings kept between starts (backend/model/tiling_store.py): a second start under the same context
reads them and measures nothing; another context, or a file that is corrupt, of another version or for
another context, measures again (never an error). Measurements are counted through the injected `measure`,
not timed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.kernels.build import source_hash
from backend.model import tiling_store
from backend.model.tiling import RowFn, RowTiling, TilingMemo
from backend.model.tiling_store import TilingContext, TilingStore, encode
from harness.models.tiny import tiny_model

# the tiny model's shapes: fused qkv, o_proj, fused gate/up, down_proj, the LM head
SHAPES = 5


class Measure:
    """A stand-in for `calibrate_tiling` that counts its calls and answers a different tiling each time, so a
    tiling read back can only be the one measured for that shape."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, torch.dtype]] = []

    def __call__(
        self, fn: RowFn, in_features: int, dtype: torch.dtype, device: torch.device | str, *, floor: int = 2
    ) -> RowTiling:
        self.calls.append((in_features, dtype))
        return RowTiling(tile_rows=4 + len(self.calls), min_rows=2)


def start(store: TilingStore) -> tuple[int, dict[str, RowTiling]]:
    """A fresh model calibrated through `store`: how many shapes it measured, and the tilings it runs with."""
    model, measure = tiny_model(), Measure()
    model.calibrate_invariance(store, measure)
    return len(measure.calls), model.tilings


@pytest.fixture
def context() -> TilingContext:
    return TilingContext.current("cpu")


def test_a_second_start_reads_the_tilings_and_measures_nothing(
    tmp_path: Path, context: TilingContext
) -> None:
    measured, first = start(TilingStore(tmp_path, context))
    assert measured == SHAPES and len(set(first.values())) == SHAPES  # layer 1 reuses layer 0's
    measured, second = start(TilingStore(tmp_path, context))
    assert measured == 0
    assert second == first


@pytest.mark.parametrize(
    "change",
    [
        {"threads": 7},
        {"kernel": "0123abcd"},
        {"torch_version": "0.0.1"},
        {"cpu_flags": ("avx2",)},
        {"cpu_model": "another CPU"},
        {"calibration": "another method"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_another_context_measures_again(
    tmp_path: Path, context: TilingContext, change: dict[str, object]
) -> None:
    first = TilingStore(tmp_path, context)
    start(first)
    stored = first.path.read_text()
    other = TilingStore(tmp_path, dataclasses.replace(context, **change))  # type: ignore[arg-type]
    assert other.path != first.path
    measured, _ = start(other)
    assert measured == SHAPES
    assert first.path.read_text() == stored and start(other)[0] == 0


def _document(ctx: TilingContext, **override: object) -> str:
    doc = json.loads(encode(ctx, {(8, 8, "torch.float32"): RowTiling(4, 2)}))
    return json.dumps(doc | override)


@pytest.mark.parametrize(
    "contents",
    [
        pytest.param(lambda c: b"", id="empty"),
        pytest.param(lambda c: b'{"version": 1, "tilings": [', id="truncated"),
        pytest.param(lambda c: b"\xff\xfe\x00garbage", id="not-utf8"),
        pytest.param(lambda c: b"[1, 2]", id="not-an-object"),
        pytest.param(lambda c: _document(c, version=2).encode(), id="unknown-version"),
        pytest.param(lambda c: _document(c, version="1").encode(), id="version-as-text"),
        pytest.param(
            lambda c: _document(c, context=dataclasses.asdict(dataclasses.replace(c, threads=99))).encode(),
            id="another-context",
        ),
        pytest.param(lambda c: _document(c, tilings=5).encode(), id="tilings-not-a-list"),
        pytest.param(
            lambda c: _document(
                c, tilings=[{"out": 8, "in": 8, "kind": "x", "tile_rows": 0, "min_rows": 2}]
            ).encode(),
            id="impossible-tiling",
        ),
        pytest.param(lambda c: _document(c, tilings=[{"out": 8}]).encode(), id="missing-fields"),
    ],
)
def test_an_unusable_file_measures_again_and_is_replaced(
    tmp_path: Path, context: TilingContext, contents: object
) -> None:
    store = TilingStore(tmp_path, context)
    assert callable(contents)
    store.path.write_bytes(contents(context))
    measured, tilings = start(store)
    assert measured == SHAPES
    assert start(store) == (0, tilings)  # the file now holds this start's measurements


def test_a_cache_that_cannot_be_written_only_costs_a_measurement(
    tmp_path: Path, context: TilingContext
) -> None:
    blocked = tmp_path / "a-file-not-a-folder"
    blocked.write_text("")
    store = TilingStore(blocked, context)
    assert start(store)[0] == SHAPES
    assert start(store)[0] == SHAPES
    assert sorted(p.name for p in tmp_path.iterdir()) == [blocked.name]


def test_stored_shapes_of_another_model_are_kept(tmp_path: Path, context: TilingContext) -> None:
    store = TilingStore(tmp_path, context)
    elsewhere: TilingMemo = {(4096, 4096, "torch.bfloat16"): RowTiling(32, 2)}
    store.save(elsewhere)
    assert start(store)[0] == SHAPES
    assert (
        store.load()[(4096, 4096, "torch.bfloat16")] == RowTiling(32, 2) and len(store.load()) == SHAPES + 1
    )


def test_the_engine_starts_from_the_stored_tilings(tmp_path: Path, context: TilingContext) -> None:
    store = TilingStore(tmp_path, context)
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_model_len=128)
    LLMEngine(tiny_model(), config, frozenset(), store)
    stored = store.load()
    assert len(stored) == SHAPES
    planted = {key: RowTiling(6, 2) for key in stored}  # not what calibration finds for the tiny model
    store.save(planted)
    model = tiny_model()
    LLMEngine(model, config, frozenset(), store)
    assert set(model.tilings.values()) == {RowTiling(6, 2)}


def test_the_context_is_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = torch.get_num_threads()
    context = TilingContext.current("cpu")
    assert context.threads == threads and context.kernel == source_hash()
    assert context.torch_version == torch.__version__ and context.device == "cpu"
    assert context.digest() == TilingContext.current("cpu").digest()
    assert dataclasses.replace(context, threads=threads + 1).digest() != context.digest()
    monkeypatch.setenv(tiling_store.ENV, "/somewhere/else")
    assert TilingStore.default("cpu").path.parent == Path("/somewhere/else")
