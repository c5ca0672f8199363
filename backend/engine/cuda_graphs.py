"""CUDA graphs for decode: the model's forward captured once per batch bucket, replayed on static buffers.

A decode-only step (every scheduled sequence runs one token, none verifies drafts or pools) of B sequences runs the
graph of the smallest bucket >= B (`DEFAULT_BUCKETS`, up to `max_num_seqs`): its inputs (token ids, positions, slot
mapping, context lengths, block tables) are copied into static buffers, the graph replays, and the first B rows of
the static hidden-state buffer are the step's. Every other step runs eagerly. What a capture freezes is everything
read on the host: the shapes (so one graph per bucket), the attention plan (built once from the static context) and
the buffers' addresses. So only backends whose plan is views of the context's device tensors and whose kernels read
lengths on the device may be captured: Triton and flash-attn's decode (`GRAPH_BACKENDS`); SDPA builds masks on the
host from the lengths and is refused.

Padding rows (bucket - B of them) point at a scratch block the engine reserves from the pool and never hands to a
sequence: token 0 at position 0, its K/V written to the scratch block's slot 0, attending to that one key. So a
padded row never reads or writes a real sequence's KV. A real row's bits: the Triton kernel runs one program per
(sequence, KV head) and never reads another sequence; in batch-invariant mode every linear runs in calibrated row
tiles (backend/model/tiling.py), so its rows do not depend on how many rows share the call, padded rows included.
So on CPU, through `EagerCapture` (this module's seam, whose replay simply calls the captured function on the static
buffers), the graph path's logits equal the eager path's bit for bit (tests/backend/test_cuda_graphs.py). Whether
cuBLAS picks the same kernels inside a capture as outside one is a fact of the GPU, checked by harness/gpu/check.py.
Without batch invariance a padded bucket changes the GEMM shapes, so a real row's bits may differ from eager.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch

from backend.attention.backend import AttentionBackend
from backend.attention.context import AttentionContext
from backend.engine.block_pool import BlockPool
from backend.engine.config import EngineConfig
from backend.engine.scheduler import ScheduledSeq
from backend.model.llama import LlamaModel

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)
GRAPH_BACKENDS = ("triton", "flash")
# Eager runs of a step before its capture, on a side stream: Triton compiles and cuBLAS picks its kernels there,
# never inside the capture.
WARMUP_RUNS = 2


class Replay(Protocol):
    def replay(self) -> None: ...


class GraphCapture(Protocol):
    """The seam: record `fn` (which reads and writes only static buffers) once; `replay` runs it again."""

    def capture(self, fn: Callable[[], None]) -> Replay: ...


@dataclass(frozen=True, slots=True)
class _Call:
    fn: Callable[[], None]

    def replay(self) -> None:
        self.fn()


class EagerCapture:
    """The seam's reference implementation (CPU, tests): replay calls the captured function on the static buffers.
    Like a graph, it keeps what the function closed over at capture (the attention plan), so a plan that copied a
    tensor instead of viewing the static buffer shows up as a wrong replay here too."""

    def capture(self, fn: Callable[[], None]) -> Replay:
        return _Call(fn)


class CudaCapture:
    """torch.cuda.CUDAGraph per bucket, warmed up on a side stream, all graphs sharing one memory pool (captured
    largest first, so the smaller ones reuse its memory)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], None]) -> Replay:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            fn()
        return graph


def pick_bucket(num_seqs: int, buckets: Seq[int]) -> int | None:
    """The smallest bucket holding num_seqs rows; None when none does (the step runs eagerly)."""
    return next((b for b in sorted(buckets) if b >= num_seqs), None)


def graph_buckets(max_num_seqs: int, buckets: Seq[int] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """The buckets worth capturing: those below max_num_seqs and the first that holds it."""
    ordered = sorted(buckets)
    cover = pick_bucket(max_num_seqs, ordered)
    return tuple(b for b in ordered if b < max_num_seqs or b == cover)


def is_graph_decode(batch: Seq[ScheduledSeq]) -> bool:
    """Whether every row is a plain decode: one token, no drafts, sampled (an embedding's last chunk pools)."""
    return bool(batch) and all(
        item.num_new_tokens == 1 and not item.draft and item.samples and not item.pools for item in batch
    )


@dataclass(frozen=True, slots=True)
class DecodeRows:
    """A decode step padded to its bucket, on the host: one entry (one table row) per bucket row."""

    token_ids: list[int]
    positions: list[int]
    slots: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]


def pad_decode(
    batch: Seq[ScheduledSeq], bucket: int, block_size: int, width: int, scratch_block: int
) -> DecodeRows:
    """The rows of a decode step, then padding rows that touch only `scratch_block`: token 0 at position 0 written
    to its slot 0 and attending to that one key. Table rows are filled to `width` with the scratch block (never
    read: the kernels stop at each row's context length)."""
    assert len(batch) <= bucket
    rows = DecodeRows([], [], [], [], [])
    for item in batch:
        table, pos = item.seq.block_table, item.start
        assert item.num_new_tokens == 1 and len(table) <= width, (item, width)
        rows.token_ids.append(item.input_ids[0])
        rows.positions.append(pos)
        rows.slots.append(table[pos // block_size] * block_size + pos % block_size)
        rows.context_lens.append(item.end)
        rows.block_tables.append(table + [scratch_block] * (width - len(table)))
    for _ in range(bucket - len(batch)):
        rows.token_ids.append(0)
        rows.positions.append(0)
        rows.slots.append(scratch_block * block_size)
        rows.context_lens.append(1)
        rows.block_tables.append([scratch_block] * width)
    return rows


@dataclass(frozen=True, slots=True)
class StaticInputs:
    """The buffers every graph reads, sized for the largest bucket; a bucket's graph reads their first rows."""

    token_ids: torch.Tensor  # [max_bucket] int64
    positions: torch.Tensor  # [max_bucket] int64
    slot_mapping: torch.Tensor  # [max_bucket] int64
    context_lens: torch.Tensor  # [max_bucket] int32
    block_tables: torch.Tensor  # [max_bucket, width] int32
    query_start_loc: torch.Tensor  # [max_bucket + 1] int32, 0..max_bucket: one token per row

    def copy_in(self, rows: DecodeRows) -> None:
        """Write a padded step into the first len(rows) rows (every row the bucket's graph reads)."""
        n = len(rows.token_ids)
        for buffer, values in (
            (self.token_ids, rows.token_ids),
            (self.positions, rows.positions),
            (self.slot_mapping, rows.slots),
            (self.context_lens, rows.context_lens),
        ):
            buffer[:n].copy_(torch.tensor(values, dtype=buffer.dtype))
        self.block_tables[:n].copy_(torch.tensor(rows.block_tables, dtype=torch.int32))


class DecodeGraphs:
    """One captured decode forward per bucket over shared static buffers; `run` replays the step's bucket."""

    def __init__(
        self,
        model: LlamaModel,
        pool: BlockPool,
        attention: AttentionBackend,
        *,
        invariant: bool,
        scratch_block: int,
        max_model_len: int,
        buckets: Seq[int],
    ) -> None:
        self.model, self.pool, self.attention, self.invariant = model, pool, attention, invariant
        self.scratch_block = scratch_block
        self.buckets = tuple(sorted(buckets))
        self.block_size = pool.block_size
        self.width = -(-max_model_len // self.block_size)  # table columns: blocks of the longest sequence
        self.replays = 0  # steps served by a graph (tests and the GPU check read it)
        self._graphs: dict[int, Replay] = {}
        most, dev = self.buckets[-1], model.device
        self.static = StaticInputs(
            token_ids=torch.zeros(most, dtype=torch.int64, device=dev),
            positions=torch.zeros(most, dtype=torch.int64, device=dev),
            slot_mapping=torch.zeros(most, dtype=torch.int64, device=dev),
            context_lens=torch.ones(most, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(most, self.width, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(most + 1, dtype=torch.int32, device=dev),
        )
        # hidden: [max_bucket, hidden] fp32, the graphs' output
        self.hidden = torch.zeros(most, model.config.hidden_size, dtype=torch.float32, device=dev)
        # every row padding until the first step: warm-ups and captures write only to the scratch block
        self.static.copy_in(pad_decode([], most, self.block_size, self.width, scratch_block))

    def capture(self, capture: GraphCapture) -> None:
        """Capture every bucket, largest first (a shared CUDA memory pool then serves the smaller ones)."""
        for bucket in reversed(self.buckets):
            self._graphs[bucket] = capture.capture(self._step_fn(bucket))

    def _step_fn(self, bucket: int) -> Callable[[], None]:
        """The forward of `bucket` rows over the static buffers; its attention plan is built here, once."""
        s = self.static
        ctx = AttentionContext(
            slot_mapping=s.slot_mapping[:bucket],
            block_tables=s.block_tables[:bucket],
            context_lens=s.context_lens[:bucket],
            query_start_loc=s.query_start_loc[: bucket + 1],
            query_lens=(1,) * bucket,
            context_lens_host=(1,) * bucket,  # read by no graph backend's decode plan
            block_size=self.block_size,
        )
        plan = self.attention.plan(ctx)
        k_caches, v_caches, backend = self.pool.k_caches, self.pool.v_caches, self.attention

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return backend.forward(q, k, v, k_caches[layer], v_caches[layer], plan)

        def step() -> None:
            hidden = self.model(s.token_ids[:bucket], s.positions[:bucket], attend, self.invariant)
            self.hidden[:bucket].copy_(hidden)  # [bucket, hidden] fp32

        return step

    def run(self, batch: Seq[ScheduledSeq]) -> torch.Tensor | None:
        """Hidden states [B, hidden] fp32 of a decode step through its bucket's graph (a view of the static output,
        valid until the next replay), or None for a step that runs eagerly."""
        bucket = pick_bucket(len(batch), self.buckets) if is_graph_decode(batch) else None
        if bucket is None or bucket not in self._graphs:
            return None
        if any(len(item.seq.block_table) > self.width for item in batch):
            return None  # never expected (max_model_len bounds every table); eager rather than a crash
        self.static.copy_in(pad_decode(batch, bucket, self.block_size, self.width, self.scratch_block))
        self._graphs[bucket].replay()
        self.replays += 1
        return self.hidden[: len(batch)]


def build_decode_graphs(
    model: LlamaModel,
    pool: BlockPool,
    attention: AttentionBackend,
    config: EngineConfig,
    capture: GraphCapture,
) -> DecodeGraphs:
    """Reserve the scratch block and capture a graph per bucket up to max_num_seqs; ValueError where the attention
    backend cannot be captured (its plan reads lengths on the host) or the layers run as one native call."""
    if attention.name not in GRAPH_BACKENDS:
        raise ValueError(
            f"cuda_graphs needs the triton or flash attention backend, got {attention.name!r} "
            "(set attention='triton', or turn cuda_graphs off)"
        )
    if model.native_stack() is not None:
        raise ValueError("cuda_graphs cannot capture the native CPU decoder step")
    scratch = pool.allocate()  # held for the engine's life: no sequence ever gets it, no hash ever names it
    graphs = DecodeGraphs(
        model,
        pool,
        attention,
        invariant=config.batch_invariant,
        scratch_block=scratch,
        max_model_len=config.max_model_len,
        buckets=graph_buckets(config.max_num_seqs),
    )
    graphs.capture(capture)
    return graphs
