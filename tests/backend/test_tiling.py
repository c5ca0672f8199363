"""Row tiling: matmuls only ever see calibrated row counts, and the calibration finds where a kernel's rows
change with M; over many real GEMM shapes, a row's bits do not depend on the rows around it."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from backend.model.tiling import RowTiling, calibrate_tiling, tiled_rows


class Recorder:
    """A row-local fn (x @ w) that records the row counts it was called with, optionally M-dependent."""

    def __init__(self, drift: dict[int, float] | None = None) -> None:
        self.calls: list[int] = []
        self.weight = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
        self.drift = drift or {}

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls.append(rows.shape[0])
        return rows @ self.weight + self.drift.get(rows.shape[0], 0.0)


def test_tiles_cover_every_row_and_pad_short_calls() -> None:
    fn = Recorder()
    x = torch.randn(21, 8)
    out = tiled_rows(fn, x, RowTiling(tile_rows=8, min_rows=3))
    assert fn.calls == [8, 8, 5]
    torch.testing.assert_close(out, x @ fn.weight)
    fn.calls.clear()
    out = tiled_rows(fn, x[:1], RowTiling(tile_rows=8, min_rows=3))
    assert fn.calls == [3] and out.shape == (1, 5)
    torch.testing.assert_close(out, x[:1] @ fn.weight)


def test_calibration_never_makes_one_row_calls() -> None:
    fn = Recorder()
    tiling = calibrate_tiling(fn, 8, torch.float32, "cpu")
    assert tiling == RowTiling(tile_rows=32, min_rows=2)
    assert min(fn.calls) == 2


def test_a_kernel_invariant_at_one_row_may_run_one_row_calls() -> None:
    fn = Recorder()
    assert calibrate_tiling(fn, 8, torch.float32, "cpu", floor=1) == RowTiling(tile_rows=32, min_rows=1)
    assert min(fn.calls) == 1
    # a kernel whose one-row call sums differently keeps the zero-padded pair
    assert calibrate_tiling(Recorder({1: 1e-3}), 8, torch.float32, "cpu", floor=1) == RowTiling(32, 2)


def test_calibration_shrinks_the_tile_below_a_kernel_switch() -> None:
    switch = {m: 1e-3 for m in range(9, 40)}  # rows change from M = 9 on
    assert calibrate_tiling(Recorder(switch), 8, torch.float32, "cpu") == RowTiling(8, 2)


def test_calibration_falls_back_to_small_fixed_tiles() -> None:
    everywhere = {m: 1e-3 * m for m in range(1, 40)}  # every M sums differently
    assert calibrate_tiling(Recorder(everywhere), 8, torch.float32, "cpu") == RowTiling(2, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out_features", "in_features"), [(64, 64), (192, 64), (333, 97)])
def test_real_gemm_rows_do_not_depend_on_their_neighbours(
    dtype: torch.dtype, out_features: int, in_features: int
) -> None:
    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype)

    def fn(rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, weight)

    tiling = calibrate_tiling(fn, in_features, dtype, "cpu")
    x = torch.randn(70, in_features, generator=gen).to(dtype)
    alone = torch.cat([tiled_rows(fn, x[r : r + 1], tiling) for r in range(70)])
    for rows, start in ((70, 0), (37, 5), (9, 40), (2, 17), (33, 30)):
        together = tiled_rows(fn, x[start : start + rows], tiling)
        assert torch.equal(together, alone[start : start + rows]), (tiling, rows, start)
