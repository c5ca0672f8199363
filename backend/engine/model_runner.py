"""The model runner: turns a scheduled step into batch tensors, runs the model over the KV pool, samples.

Embedding sequences (backend/engine/embedding.py) share the forward; their last chunk's final hidden state is
stored on them instead of being sampled.

The step's new tokens are flattened across sequences (prefill chunks and decodes mixed); each sequence's
next token is sampled only when its chunk reaches the end of its tokens. A decode verifying speculative drafts
runs its last token and the step's drafts (`ScheduledSeq.draft`, never in `seq.token_ids`) and samples after
each. With `invariant`, the model runs its linears and LM head in calibrated row tiles (the attention backend
was chosen to match by the engine).
Rows whose request processes logits or wants logprobs get the exact fp32 head; their processors run on their
own row before sampling (backend/engine/logits_processor.py), and the sampled token then advances the row's
grammar and its logprobs are left on the sequence for the engine's postprocess.
With `graphs` set (EngineConfig.cuda_graphs), a decode-only step's forward replays a captured CUDA graph
(backend/engine/cuda_graphs.py); sampling and everything after the hidden states run eagerly either way.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from backend.attention.backend import AttentionBackend
from backend.attention.context import AttentionContext
from backend.engine.block_pool import BlockPool
from backend.engine.cuda_graphs import DecodeGraphs
from backend.engine.embedding import EmbeddingSequence
from backend.engine.logits_processor import process_logits, token_logprobs
from backend.engine.sampling import sample
from backend.engine.scheduler import ScheduledSeq
from backend.engine.speculative import accept
from backend.model.llama import LlamaModel
from backend.model.native_step import PagedStep


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        pool: BlockPool,
        attention: AttentionBackend,
        invariant: bool = False,
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.invariant = invariant
        self.pool = pool
        self.attention = attention
        self.device = model.device
        self.graphs: DecodeGraphs | None = None  # set by the engine when cuda_graphs is on

    def build_context(self, batch: Seq[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionContext]:
        """token_ids [T], positions [T] and the attention context of a step."""
        bs = self.pool.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        for item in batch:
            seq, start, end = item.seq, item.start, item.end
            assert len(seq.block_table) * bs >= end, f"{seq} lacks blocks for {end} tokens"
            token_ids.extend(item.input_ids)  # the sequence's tokens, then any drafts it verifies
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            query_start.append(query_start[-1] + item.num_new_tokens)
            context_lens.append(end)
        max_blocks = max(len(item.seq.block_table) for item in batch)
        block_tables = [
            item.seq.block_table + [0] * (max_blocks - len(item.seq.block_table)) for item in batch
        ]
        dev = self.device
        ctx = AttentionContext(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(block_tables, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
            query_lens=tuple(item.num_new_tokens for item in batch),
            context_lens_host=tuple(context_lens),
            block_size=bs,
        )
        return (
            torch.tensor(token_ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            ctx,
        )

    @torch.inference_mode()
    def compute_logits(self, batch: Seq[ScheduledSeq]) -> torch.Tensor:
        """fp32 logits [N, vocab] for the sequences whose chunk reaches their end (in batch order); a
        sequence verifying k drafts gets k + 1 rows, one per position from its last token on."""
        graphed = self.graphs.run(batch) if self.graphs is not None else None  # [B, hidden]: plain decodes
        if graphed is not None:
            hidden, ends = graphed, tuple(range(1, len(batch) + 1))
        else:
            hidden, ends = self.forward(batch)
        last: list[int] = []
        greedy: list[bool] = []
        for item, end in zip(batch, ends, strict=True):
            if item.pools:  # last-token pooling (backend/engine/embedding.py); a copy, not a view of the step
                assert isinstance(item.seq, EmbeddingSequence)
                item.seq.embedding = hidden[end - 1].clone()  # [hidden] fp32
            if item.samples:  # the last position, and every draft's position when verifying drafts
                n = 1 + len(item.draft)
                last.extend(range(end - n, end))
                greedy.extend([not item.seq.params.exact_logits] * n)
        rows = hidden[torch.tensor(last, dtype=torch.int64, device=self.device)]  # [N, hidden]
        return self.model.compute_logits(rows, self.invariant, greedy)  # [N, vocab]

    def forward(self, batch: Seq[ScheduledSeq]) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The eager forward: hidden states [T, hidden] fp32 and where each sequence's new tokens end."""
        token_ids, positions, ctx = self.build_context(batch)
        k_caches, v_caches, backend = self.pool.k_caches, self.pool.v_caches, self.attention
        step = None
        if self.model.native_stack() is not None:  # the layers run as one native call: no attention plan
            step = PagedStep(ctx, k_caches, v_caches)
        plan = backend.plan(ctx) if step is None else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return backend.forward(q, k, v, k_caches[layer], v_caches[layer], plan)

        hidden = self.model(token_ids, positions, attend, self.invariant, step)  # [T, hidden] fp32
        return hidden, ctx.query_start_host[1:]

    def run(self, batch: Seq[ScheduledSeq]) -> list[int | list[int] | None]:
        """One step: the sampled token per scheduled sequence, None for a prefill chunk short of the end,
        and for a sequence verifying drafts the tokens it gained (`speculative.accept`)."""
        logits = self.compute_logits(batch)  # [N, vocab]
        samplers = [item.seq for item in batch if item.samples for _ in range(1 + len(item.draft))]
        process_logits(logits, samplers, self.eos_token_ids)
        picked = sample(logits, [s.params for s in samplers], [s.generator for s in samplers])
        for row, (seq, token) in enumerate(zip(samplers, picked, strict=True)):
            if seq.params.logprobs is not None:  # such rows never carry drafts: one row per sequence
                seq.step_logprobs = token_logprobs(logits[row], token, seq.params.logprobs)
            if seq.matcher is not None:
                seq.matcher.accept(token)
        tokens = iter(picked)
        out: list[int | list[int] | None] = []
        for item in batch:
            if not item.samples:
                out.append(None)
            elif item.draft:
                out.append(accept(item.draft, [next(tokens) for _ in range(1 + len(item.draft))]))
            else:
                out.append(next(tokens))
        return out
