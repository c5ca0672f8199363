"""Row tiling for batch-invariant matmuls: a token's row goes through a GEMM of a shape that never depends
on how many other tokens share the step, at a position and an address alignment that do not change its bits.

GEMM libraries pick their kernel (and so the summation order inside a row) from the shape: MKL's fp32 sgemm
takes a GEMV path at M = 1 and other blockings past M = 3 or M = 15 depending on N and K; oneDNN's bf16 kernels
differ between CPUs with and without AMX. Within one call a row's bits may also depend on where it sits:
measured on an AMD EPYC (Zen 5, AVX-512, no AMX; torch 2.13's MKL 2024.2), sgemm sums every fourth row of an
[M, 8] @ [8, 5] call differently from the others, and a row's bits follow its address (rows 4 bytes off a
16-byte boundary, as three rows in four of a K = 97 call are, sum differently). So `tiled_rows` never hands the
library an arbitrary M: the rows are cut into tiles of `tile_rows`, a short last tile is zero-padded up to
`min_rows` (never below 2 by default: a one-row call is a GEMV), and every call's rows start on a 64-byte
boundary (`aligned`). Which tile is safe is measured, not assumed: `calibrate_tiling` runs the very matmul on
random rows at every M in [2, tile], over enough random trials that ~131k outputs are compared per M, and keeps
the largest candidate under which each row's bits are the same at every M, with other rows cut off before or
after it, and at every position of the call (one random row repeated M times must give M copies of the same
bits). Where no candidate passes, each row runs alone (`ROW_BY_ROW`): one aligned one-row call per row,
invariant by construction. That is evidence on the machine at hand (kernel choice depends on the shape, the
dtype, the CPU and the thread count, not on the values), and the engine-level tests check the end-to-end
property on top of it.

Any linear can use it: a dense `nn.Linear`, a packed int4/int8 matmul or the LM head all pass their matmul
as `fn` to `calibrate_tiling` once and to `tiled_rows` on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

# [M, in_features] -> [M, out_features]; row i of the result depends on row i of the input only
RowFn = Callable[[torch.Tensor], torch.Tensor]
# (out_features, in_features, dtype name) -> the tiling measured for that shape
TilingMemo = dict[tuple[int, int, str], "RowTiling"]

# Tile candidates, largest first: a large tile keeps prefill near one GEMM per layer, a small `min_rows`
# keeps batch-1 decode near a GEMV. The first candidate that calibrates with min_rows <= 2 wins. Measured
# on SmolLM2's shapes (AVX-512 + AMX): oneDNN bf16 rows agree for M = 1..32; MKL fp32 rows for M = 2..15
# (the M = 1 GEMV differs). On an AMD EPYC (AVX-512, no AMX): oneDNN bf16 for M = 1..48, MKL fp32 for
# M = 2..3 only. Larger tiles (64+) failed there and cost minutes of calibration per shape.
DEFAULT_CANDIDATES = (32, 16, 15, 8, 4, 3, 2)
# Never a one-row call by default: M = 1 is a GEMV in MKL (fp32) and in torch's bf16 path, with its own
# summation order. bf16 outputs round most order changes away, so random probing alone misses it (seen in the
# engine tests). Kernels that walk every row alike (torch's int4/int8 weight-only kernels: each row is the
# same dot-product loop, tests/backend/test_quant.py) calibrate with `floor=1`: a batch-1 decode then runs
# one row, not a zero-padded pair (half the int4 kernel's work, whose cost grows with M).
MIN_ROWS = 2
# Outputs compared per row count while calibrating, over up to MAX_TRIALS random inputs (small shapes need
# many trials before an order change shows through bf16 rounding).
COMPARED_ELEMENTS = 1 << 17
MAX_TRIALS = 64
# Every call's rows start on this boundary of their storage (torch's CPU allocator aligns storages to 64
# bytes): MKL's sgemm sums a row differently by its address modulo 64 bytes on some CPUs (see above).
ALIGN_BYTES = 64


@dataclass(frozen=True, slots=True)
class RowTiling:
    """Every matmul call sees between `min_rows` and `tile_rows` rows (zero rows pad a short call)."""

    tile_rows: int
    min_rows: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_rows <= self.tile_rows:
            raise ValueError(f"need 1 <= min_rows <= tile_rows, got {self}")


# The fallback where no candidate tile is invariant: every row alone in an aligned one-row call, so a row's
# call has the same shape, position, alignment and (no) neighbours whatever else is batched.
ROW_BY_ROW = RowTiling(tile_rows=1, min_rows=1)


class Calibrate(Protocol):
    """`calibrate_tiling` as the layers call it, passed down so a test can count the measurements."""

    def __call__(
        self, fn: RowFn, in_features: int, dtype: torch.dtype, device: torch.device | str, *, floor: int = ...
    ) -> RowTiling: ...


def aligned(rows: torch.Tensor) -> torch.Tensor:
    """rows itself where it is contiguous and starts on an ALIGN_BYTES boundary of its storage, else a copy."""
    # rows: [M, in]
    if rows.is_contiguous() and rows.storage_offset() * rows.element_size() % ALIGN_BYTES == 0:
        return rows
    return rows.clone(memory_format=torch.contiguous_format)


def tiled_rows(fn: RowFn, x: torch.Tensor, tiling: RowTiling) -> torch.Tensor:
    """fn over x's rows, in tiles: the same bits per row whatever the number of rows in x."""
    # x: [M, in] -> [M, out]
    num_rows = x.shape[0]
    if num_rows == 0 or tiling.min_rows <= num_rows <= tiling.tile_rows:
        return fn(aligned(x))
    outs = []
    for start in range(0, num_rows, tiling.tile_rows):
        tile = x[start : start + tiling.tile_rows]  # [m, in], m <= tile_rows
        rows = tile.shape[0]
        if rows < tiling.min_rows:
            pad = tile.new_zeros(tiling.min_rows - rows, tile.shape[1])
            tile = torch.cat((tile, pad))  # [min_rows, in]
        outs.append(fn(aligned(tile))[:rows])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _agree_at(fn: RowFn, trials: Sequence[torch.Tensor], fulls: Sequence[torch.Tensor], rows: int) -> bool:
    """Whether calls of `rows` rows give the full tile's bits for each row, with its neighbours cut off before
    or after it, and at every position in the call."""
    # trials: [tile, in] each; fulls: fn of them, [tile, out] each
    tile = trials[0].shape[0]
    for x, full in zip(trials, fulls, strict=False):
        for o in {0, tile - rows}:
            if not torch.equal(fn(aligned(x[o : o + rows])), full[o : o + rows]):
                return False
        same = x[:1].expand(rows, -1).contiguous()  # [rows, in]: one row at every position
        if not torch.equal(fn(same), full[:1].expand(rows, -1)):
            return False
    return True


def _min_rows_at(fn: RowFn, blocks: Sequence[torch.Tensor], tile: int, floor: int) -> int | None:
    """The least m in [floor, MIN_ROWS] such that every call of m..tile rows gives the rows of the full tile,
    None where there is none. One trial screens first: most kernel switches show in it, so a failing candidate
    costs a few calls, not the full sweep."""
    # blocks: trials of x, each [max_tile, in]
    trials = [x[:tile] for x in blocks]  # [tile, in] each
    fulls = [fn(aligned(trials[0]))]  # [tile, out] each
    screened = _least(fn, trials[:1], fulls, floor)
    if screened is None or screened > MIN_ROWS:
        return None
    fulls += [fn(aligned(x)) for x in trials[1 : _trials(floor, fulls[0].shape[1], len(trials))]]
    least = _least(fn, trials, fulls, floor)
    return least if least is not None and least <= MIN_ROWS else None


def _least(
    fn: RowFn, trials: Sequence[torch.Tensor], fulls: Sequence[torch.Tensor], floor: int
) -> int | None:
    """The least m >= floor such that calls of m..tile rows agree with `fulls` over enough of `trials`."""
    least: int | None = None
    for rows in range(trials[0].shape[0], floor - 1, -1):
        count = _trials(rows, fulls[0].shape[1], len(fulls))
        if not _agree_at(fn, trials[:count], fulls[:count], rows):
            break
        least = rows
    return least


def _trials(rows: int, out_features: int, most: int) -> int:
    """Enough random trials that COMPARED_ELEMENTS outputs are compared (bf16 outputs hide most order changes)."""
    return max(1, min(most, -(-COMPARED_ELEMENTS // (rows * out_features))))


@torch.inference_mode()
def calibrate_tiling(
    fn: RowFn,
    in_features: int,
    dtype: torch.dtype,
    device: torch.device | str,
    candidates: Sequence[int] = DEFAULT_CANDIDATES,
    seed: int = 0,
    floor: int = MIN_ROWS,
) -> RowTiling:
    """The largest candidate tile whose rows agree from `floor` rows up, else ROW_BY_ROW."""
    assert 1 <= floor <= MIN_ROWS
    gen = torch.Generator().manual_seed(seed)
    width = max(candidates)
    x = torch.randn(MAX_TRIALS * width, in_features, generator=gen).to(device=device, dtype=dtype)
    blocks = list(x.split(width))  # [width, in] each
    for tile in sorted(candidates, reverse=True):
        if tile < MIN_ROWS:
            continue
        least = _min_rows_at(fn, blocks, tile, floor)
        if least is not None:
            return RowTiling(tile, least)
    return ROW_BY_ROW
