"""Row tiling: matmuls only ever see calibrated row counts, and the calibration finds where a kernel's rows
change with M, with their position in the call or with their address; over many real GEMM shapes, a row's bits
do not depend on the rows around it, whatever tiling the calibration picks on this CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.nn import functional as F

from backend.model.tiling import ALIGN_BYTES, ROW_BY_ROW, RowTiling, aligned, calibrate_tiling, tiled_rows


class Recorder:
    """A real GEMM (x @ w on an 8x5 weight) that records the row counts it was called with."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.weight = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls.append(rows.shape[0])
        return rows @ self.weight


class FakeKernel:
    """A row-local kernel whose bits are the same on every CPU (an elementwise product: one rounding per
    element, whatever the vector width), plus a drift where a real kernel would sum a row in another order:
    by the call's row count, by a row's position in the call, or by a row's address modulo 64 bytes."""

    def __init__(
        self,
        by_rows: dict[int, float] | None = None,
        by_position: Callable[[int], bool] | None = None,
        by_address: bool = False,
    ) -> None:
        self.calls: list[int] = []
        self.scale = torch.randn(5, generator=torch.Generator().manual_seed(0))
        self.by_rows = by_rows or {}
        self.by_position = by_position
        self.by_address = by_address

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        # rows: [M, 8] -> [M, 5]
        num_rows = rows.shape[0]
        self.calls.append(num_rows)
        out = rows[:, :5] * self.scale + self.by_rows.get(num_rows, 0.0)
        drift = torch.zeros(num_rows, 1)
        for p in range(num_rows):
            if self.by_position is not None and self.by_position(p):
                drift[p] = 1e-3
            if self.by_address and rows[p].data_ptr() % ALIGN_BYTES:
                drift[p] = 2e-3
        return out + drift


def _unaligned(x: torch.Tensor) -> torch.Tensor:
    """x's values in a storage where they start 4 bytes past a 64-byte boundary."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype)
    view = buf[1:].view(x.shape)
    view.copy_(x)
    assert view.data_ptr() % ALIGN_BYTES != 0
    return view


def _assert_rows_stand_alone(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tiling: RowTiling
) -> None:
    """Every row of x gets the bits it gets alone, in any run of rows, from an aligned or unaligned buffer."""
    num_rows = x.shape[0]
    alone = torch.cat([tiled_rows(fn, x[r : r + 1], tiling) for r in range(num_rows)])
    for rows, start in ((num_rows, 0), (37, 5), (9, 40), (2, 17), (33, 30), (3, 1), (5, 3)):
        part, expected = x[start : start + rows], alone[start : start + rows]
        assert torch.equal(tiled_rows(fn, part, tiling), expected), (tiling, rows, start)
        assert torch.equal(tiled_rows(fn, _unaligned(part), tiling), expected), (tiling, rows, start)


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


def test_every_call_gets_rows_on_a_64_byte_boundary() -> None:
    x = torch.randn(10, 8)
    seen: list[int] = []

    def fn(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.data_ptr() % ALIGN_BYTES)
        return rows[:, :5].clone()

    out = tiled_rows(fn, _unaligned(x), RowTiling(tile_rows=3, min_rows=2))  # tiles start 96 bytes apart
    assert seen == [0, 0, 0, 0] and torch.equal(out, x[:, :5])
    already = x[2:]  # 64 bytes into its storage: passed as it is
    assert aligned(already) is already and aligned(x[1:]) is not x[1:]


def test_calibration_never_makes_one_row_calls() -> None:
    fn = FakeKernel()
    assert calibrate_tiling(fn, 8, torch.float32, "cpu") == RowTiling(tile_rows=32, min_rows=2)
    assert min(fn.calls) == 2


def test_a_kernel_invariant_at_one_row_may_run_one_row_calls() -> None:
    fn = FakeKernel()
    assert calibrate_tiling(fn, 8, torch.float32, "cpu", floor=1) == RowTiling(tile_rows=32, min_rows=1)
    assert min(fn.calls) == 1
    # a kernel whose one-row call sums differently keeps the zero-padded pair
    assert calibrate_tiling(FakeKernel({1: 1e-3}), 8, torch.float32, "cpu", floor=1) == RowTiling(32, 2)


def test_calibration_shrinks_the_tile_below_a_kernel_switch() -> None:
    switch = {m: 1e-3 for m in range(9, 40)}  # rows change from M = 9 on
    assert calibrate_tiling(FakeKernel(switch), 8, torch.float32, "cpu") == RowTiling(8, 2)


def test_calibration_shrinks_the_tile_below_a_position_that_sums_differently() -> None:
    # every fourth row of a call sums differently (MKL's sgemm on an [M, 8] @ [8, 5] call, AMD EPYC)
    fn = FakeKernel(by_position=lambda p: p % 4 == 3)
    tiling = calibrate_tiling(fn, 8, torch.float32, "cpu")
    assert tiling == RowTiling(3, 2)
    _assert_rows_stand_alone(fn, torch.randn(70, 8), tiling)


def test_a_kernel_that_reads_the_rows_addresses_runs_them_one_by_one() -> None:
    # rows 32 bytes long: every other row of a call is off a 64-byte boundary and sums differently (as MKL's
    # sgemm does for K = 97 on an AMD EPYC); views of one buffer keep each row's address, so only rows
    # moved to other positions show it
    fn = FakeKernel(by_address=True)
    tiling = calibrate_tiling(fn, 8, torch.float32, "cpu")
    assert tiling == ROW_BY_ROW
    fn.calls.clear()
    _assert_rows_stand_alone(fn, torch.randn(70, 8), tiling)
    assert set(fn.calls) == {1}


def test_calibration_settles_on_fixed_pairs_where_every_m_differs() -> None:
    everywhere = {m: 1e-3 * m for m in range(1, 40)}  # every M sums differently
    fn = FakeKernel(everywhere)
    assert calibrate_tiling(fn, 8, torch.float32, "cpu") == RowTiling(2, 2)
    _assert_rows_stand_alone(fn, torch.randn(70, 8), RowTiling(2, 2))


def test_calibration_falls_back_to_one_row_a_call() -> None:
    # every M and the second row of any call sum differently: no tile of two rows or more is invariant
    fn = FakeKernel({m: 1e-3 * m for m in range(1, 40)}, by_position=lambda p: p == 1)
    assert calibrate_tiling(fn, 8, torch.float32, "cpu") == ROW_BY_ROW
    _assert_rows_stand_alone(fn, torch.randn(70, 8), ROW_BY_ROW)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out_features", "in_features"), [(64, 64), (192, 64), (333, 97), (576, 576)])
def test_real_gemm_rows_do_not_depend_on_their_neighbours(
    dtype: torch.dtype, out_features: int, in_features: int
) -> None:
    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype)
    calls: list[int] = []

    def fn(rows: torch.Tensor) -> torch.Tensor:
        calls.append(rows.shape[0])
        return F.linear(rows, weight)

    tiling = calibrate_tiling(fn, in_features, dtype, "cpu")
    assert tiling.min_rows <= 2
    calls.clear()
    _assert_rows_stand_alone(fn, torch.randn(70, in_features, generator=gen).to(dtype), tiling)
    assert tiling.min_rows <= min(calls) and max(calls) <= tiling.tile_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_gemm_on_a_narrow_weight_keeps_each_row_bits(dtype: torch.dtype) -> None:
    # x @ w on an 8x5 weight: on an AMD EPYC's MKL, every fourth row of a call sums differently
    fn = Recorder()
    fn.weight = fn.weight.to(dtype)
    tiling = calibrate_tiling(fn, 8, dtype, "cpu")
    assert min(fn.calls) == 2
    _assert_rows_stand_alone(fn, torch.randn(70, 8).to(dtype), tiling)
