"""CUDA graphs for decode (backend/engine/cuda_graphs.py) without a GPU: bucket choice, padding rows on the scratch
block, the static buffers' copy-in / replay / copy-out through the seam's reference implementation (`EagerCapture`,
whose replay calls the captured function on the static buffers), the graph path's logits equal to the eager path's
bit for bit on the tiny model (Triton under its interpreter), the configuration refusing graphs off CUDA, and a
padded row sent to a real block failing that equality. The one test that captures real graphs needs CUDA."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported: the CPU engines interpret the kernel

from dataclasses import replace

import pytest
import torch

from backend.attention.context import AttentionContext
from backend.engine import cuda_graphs
from backend.engine.config import EngineConfig
from backend.engine.cuda_graphs import (
    DecodeGraphs,
    EagerCapture,
    build_decode_graphs,
    graph_buckets,
    is_graph_decode,
    pad_decode,
    pick_bucket,
)
from backend.engine.embedding import EmbeddingSequence
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import ScheduledSeq
from backend.engine.sequence import Sequence
from harness.gpu.speed import tiny_model
from harness.logits_spy import LogitsSpy

BS = 4  # block size: the tiny engines' sequences cross block boundaries within a few tokens
PROMPTS = [[5, 9, 14, 3, 7], [11, 2, 8], [1, 4, 6, 200, 31, 17, 9]]  # 3 rows: bucket 4, one padded row
MAX_TOKENS = [7, 4, 6]  # rows finish at different steps: batches of 3, 2 and 1


def decode_item(tokens: list[int], table: list[int]) -> ScheduledSeq:
    seq = Sequence("r", tokens, SamplingParams(temperature=0, max_tokens=4))
    seq.block_table = table
    seq.num_computed_tokens = len(tokens) - 1
    return ScheduledSeq(seq, 1, len(tokens) - 1)


@pytest.mark.parametrize(
    "num_seqs, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (32, 32), (33, None)]
)
def test_a_step_takes_the_smallest_bucket_that_holds_it(num_seqs: int, bucket: int | None) -> None:
    assert pick_bucket(num_seqs, cuda_graphs.DEFAULT_BUCKETS) == bucket


@pytest.mark.parametrize(
    "max_num_seqs, buckets",
    [
        (1, (1,)),
        (3, (1, 2, 4)),
        (16, (1, 2, 4, 8, 16)),
        (20, (1, 2, 4, 8, 16, 32)),
        (64, (1, 2, 4, 8, 16, 32)),
    ],
)
def test_buckets_are_captured_up_to_the_first_holding_max_num_seqs(
    max_num_seqs: int, buckets: tuple[int]
) -> None:
    assert graph_buckets(max_num_seqs) == buckets


def test_only_plain_decodes_take_a_graph() -> None:
    decode = decode_item([1, 2, 3], [5])
    chunk = ScheduledSeq(decode.seq, 2, 1)
    drafted = ScheduledSeq(decode.seq, 3, 2, draft=(4, 5))
    embedding = EmbeddingSequence("e", [1, 2])
    embedding.block_table, embedding.num_computed_tokens = [6], 1
    assert is_graph_decode([decode, decode_item([4, 5], [7])])
    assert not is_graph_decode([])
    assert not is_graph_decode([decode, chunk])
    assert not is_graph_decode([drafted])
    assert not is_graph_decode([ScheduledSeq(embedding, 1, 1)])  # pools its last state, never samples


def test_padding_rows_touch_only_the_scratch_block() -> None:
    batch = [decode_item(list(range(6)), [7, 3]), decode_item([1, 2, 3, 4], [9])]  # positions 5 and 3
    rows = pad_decode(batch, bucket=4, block_size=BS, width=3, scratch_block=0)
    assert rows.token_ids == [5, 4, 0, 0]
    assert rows.positions == [5, 3, 0, 0]
    assert rows.slots == [
        3 * BS + 1,
        9 * BS + 3,
        0,
        0,
    ]  # table[pos // BS] * BS + pos % BS; padding: slot 0 of 0
    assert rows.context_lens == [6, 4, 1, 1]
    assert rows.block_tables == [[7, 3, 0], [9, 0, 0], [0, 0, 0], [0, 0, 0]]
    other = pad_decode(batch, bucket=2, block_size=BS, width=2, scratch_block=12)
    assert other.slots == [3 * BS + 1, 9 * BS + 3] and other.block_tables == [[7, 3], [9, 12]]


def test_the_seam_replays_the_captured_function_on_the_static_buffers() -> None:
    static_in, static_out = torch.zeros(3), torch.zeros(3)

    def step() -> None:
        static_out.copy_(static_in * 2)

    graph = EagerCapture().capture(step)
    assert torch.equal(static_out, torch.zeros(3))  # capturing records, it does not run
    static_in.copy_(torch.tensor([1.0, 2.0, 3.0]))
    graph.replay()
    assert torch.equal(static_out, torch.tensor([2.0, 4.0, 6.0]))


def engine(graphs: bool) -> LLMEngine:
    """The tiny model in fp32 on the Triton kernel (interpreted), batch-invariant; with `graphs` the decode graphs
    captured through the CPU seam (the engine's own flag refuses a CPU device)."""
    model = tiny_model(torch.float32, "cpu")
    config = EngineConfig(
        block_size=BS,
        num_blocks=64,
        max_num_seqs=4,
        max_model_len=32,
        attention="triton",
        speculative_tokens=0,
    )
    built = LLMEngine(model, config, frozenset())
    if graphs:
        built.runner.graphs = build_decode_graphs(model, built.pool, built.attention, config, EagerCapture())
    return built


def sampled_logits(built: LLMEngine) -> list[tuple[int, torch.Tensor]]:
    spy = LogitsSpy(built)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    built.generate(PROMPTS, params)
    return [(num_tokens, logits) for _seq, num_tokens, logits in spy.rows]


@pytest.fixture(scope="module")
def eager_logits() -> list[tuple[int, torch.Tensor]]:
    return sampled_logits(engine(graphs=False))


def test_graph_decode_logits_equal_the_eager_ones_bit_for_bit(
    eager_logits: list[tuple[int, torch.Tensor]],
) -> None:
    graphed = engine(graphs=True)
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.buckets == (1, 2, 4) and graphs.scratch_block == 0
    got = sampled_logits(graphed)
    assert graphs.replays == max(MAX_TOKENS) - 1  # every decode step ran through a graph (buckets 4, 2, 1)
    assert [n for n, _ in got] == [n for n, _ in eager_logits]
    for (_, ours), (_, theirs) in zip(got, eager_logits, strict=True):
        assert torch.equal(ours, theirs)
    assert (
        graphed.pool.ref_count(0) == 1 and graphed.pool.num_free_blocks == 63
    )  # the scratch block stays held


def test_a_padding_row_on_a_real_block_breaks_the_equality(
    eager_logits: list[tuple[int, torch.Tensor]],
) -> None:
    """The mutation check: padding rows written into block 1 (the first prompt's first block) must show."""
    graphed = engine(graphs=True)
    assert graphed.runner.graphs is not None
    graphed.runner.graphs.scratch_block = 1
    got = sampled_logits(graphed)
    assert any(
        not torch.equal(ours, theirs) for (_, ours), (_, theirs) in zip(got, eager_logits, strict=True)
    )


def test_a_plan_that_copied_the_static_buffers_would_replay_stale_inputs(
    eager_logits: list[tuple[int, torch.Tensor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seam keeps what a capture froze: an attention plan built from copies of the static context (as a real
    graph would keep them) replays the capture-time lengths, and the logits differ."""
    graphed = engine(graphs=False)
    plan = graphed.attention.plan
    monkeypatch.setattr(graphed.attention, "plan", lambda ctx: plan(_copied(ctx)))
    config = graphed.config
    graphed.runner.graphs = build_decode_graphs(
        graphed.model, graphed.pool, graphed.attention, config, EagerCapture()
    )
    monkeypatch.setattr(graphed.attention, "plan", plan)  # eager steps plan as usual
    got = sampled_logits(graphed)
    assert any(
        not torch.equal(ours, theirs) for (_, ours), (_, theirs) in zip(got, eager_logits, strict=True)
    )


def _copied(ctx: AttentionContext) -> AttentionContext:
    return replace(ctx, context_lens=ctx.context_lens.clone(), block_tables=ctx.block_tables.clone())


def test_steps_past_the_largest_bucket_or_not_decoding_run_eagerly() -> None:
    graphs = engine(graphs=True).runner.graphs
    assert isinstance(graphs, DecodeGraphs) and graphs.buckets == (1, 2, 4)
    assert graphs.run([decode_item([1, 2], [3])] * 5) is None
    assert graphs.run([ScheduledSeq(decode_item([1, 2, 3], [3]).seq, 2, 1)]) is None
    assert graphs.replays == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({}, "needs a CUDA device"),
        ({"device": "cuda", "attention": "sdpa"}, "attention 'triton', 'flash' or 'auto'"),
        ({"device": "cuda", "num_blocks": 2, "block_size": 16, "max_model_len": 32}, "scratch block"),
    ],
)
def test_the_config_refuses_graphs_where_they_cannot_run(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(cuda_graphs=True, **overrides)  # type: ignore[arg-type]
    EngineConfig(cuda_graphs=True, device="cuda", attention="auto")  # the engine checks what auto resolves to
    assert EngineConfig().cuda_graphs is False  # off by default, until measured on a GPU


def test_the_flag_and_its_variable_reach_the_engine_config() -> None:
    from backend.config import BackendConfig

    on = BackendConfig.from_sources(["--cuda-graphs", "on", "--device", "cuda"], environ={}).engine
    assert on.cuda_graphs is True
    env = {"TOKENEDGE_BACKEND_CUDA_GRAPHS": "true"}
    with pytest.raises(ValueError, match="needs a CUDA device"):
        BackendConfig.from_sources([], environ=env)


def test_an_engine_refuses_to_capture_a_backend_that_plans_on_the_host() -> None:
    model = tiny_model(torch.float32, "cpu")
    config = EngineConfig(
        block_size=BS, num_blocks=16, max_model_len=32, attention="sdpa", batch_invariant=False
    )
    built = LLMEngine(model, config, frozenset())
    with pytest.raises(ValueError, match="triton or flash"):
        build_decode_graphs(model, built.pool, built.attention, config, EagerCapture())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_cuda_graphs_give_the_eager_logits_bit_for_bit() -> None:
    """On a GPU: real graphs (bf16 tiny model, Triton, batch-invariant) against the eager engine, bitwise."""
    outs = []
    for graphs in (False, True):
        model = tiny_model(torch.bfloat16, "cuda")
        config = EngineConfig(
            block_size=16, num_blocks=64, max_num_seqs=4, max_model_len=64, attention="triton",
            speculative_tokens=0, device="cuda", cuda_graphs=graphs,
        )  # fmt: skip
        built = LLMEngine(model, config, frozenset())
        outs.append(sampled_logits(built))
        assert (built.runner.graphs is not None) == graphs
        if built.runner.graphs is not None:
            assert built.runner.graphs.replays == max(MAX_TOKENS) - 1
    for (_, eager), (_, graphed) in zip(*outs, strict=True):
        assert torch.equal(eager, graphed)
