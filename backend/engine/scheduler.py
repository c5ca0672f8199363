"""The scheduler: which sequences advance this step and by how many tokens.

Policy (vLLM v1 style, one token budget for prefill and decode alike): running sequences first,
decodes before prefill chunks, each taking what it still needs (1 token for a decode, the rest of its
prompt in chunks for a prefill); then waiting sequences while the budget, `max_num_seqs` and the pool
allow. When a running sequence cannot get a block, the most recently admitted running sequence not yet
scheduled this step is preempted by recompute: its blocks are freed and it goes back to the front of the waiting queue (its full blocks stay
cached, so the recompute is often a prefix hit). No new admissions happen in a step that preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from backend.engine.config import EngineConfig
from backend.engine.embedding import EmbeddingSequence
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    start: int  # num_computed_tokens when scheduled: the first new token's position

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so its last logits give the next token."""
        reaches_end = self.start + self.num_new_tokens == self.seq.num_tokens
        return reaches_end and not isinstance(self.seq, EmbeddingSequence)

    @property
    def pools(self) -> bool:
        """Whether this is the last chunk of an embedding sequence: its last hidden state is the result."""
        reaches_end = self.start + self.num_new_tokens == self.seq.num_tokens
        return reaches_end and isinstance(self.seq, EmbeddingSequence)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, eos_token_ids: frozenset[int]) -> None:
        self.config = config
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_hit_tokens_total = 0
        self.num_preemptions_total = 0

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        taken: set[int] = set()  # ids of sequences scheduled this step: never preempted
        preempted = False
        # decodes first (stable sort), so a long prefill chunk never starves the streams already running
        # (a decode verifying speculative drafts is still a decode: it comes first, whole)
        for seq in sorted(
            self.running, key=lambda s: s.num_tokens - len(s.draft) - s.num_computed_tokens > 1
        ):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted as a victim earlier in this loop
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            assert num_new > 0, f"running {seq} has nothing to compute"
            while not self.kv.allocate(seq, num_new):
                # the most recently admitted sequence not yet scheduled this step (possibly seq itself)
                victim = next(s for s in reversed(self.running) if id(s) not in taken)
                self.running.remove(victim)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens))
                taken.add(id(seq))
                budget -= num_new
        if preempted:
            return scheduled
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self.kv.match_prefix(seq)
            num_cached = len(cached) * self.kv.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self.kv.allocate(seq, num_new, cached):
                break
            self.waiting.popleft()
            if not seq.admitted:
                seq.admitted = True
                seq.num_cached_tokens = num_cached
            self.prefix_hit_tokens_total += num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens))
            budget -= num_new
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(seq)

    def postprocess(
        self, scheduled: Iterable[ScheduledSeq], sampled: Iterable[int | list[int] | None]
    ) -> list[tuple[Sequence, int, FinishReason | None]]:
        """Advance computed counts, register full blocks, append sampled tokens; returns each new token.

        A sequence that verified speculative drafts (`seq.draft`) gets a list: the accepted drafts then the
        pick after them. Its drafts leave `token_ids` first, and only the accepted drafts' KV counts as
        computed; tokens after a finishing one are dropped.
        """
        new_tokens: list[tuple[Sequence, int, FinishReason | None]] = []
        for item, token in zip(scheduled, sampled, strict=True):
            seq = item.seq
            tokens = [] if token is None else [token] if isinstance(token, int) else token
            num_draft = len(seq.draft)
            if num_draft:
                del seq.token_ids[-num_draft:]
                seq.draft = []
            accepted = len(tokens) - 1 if num_draft else 0
            seq.num_computed_tokens = item.start + item.num_new_tokens - num_draft + accepted
            seq.token_ids.extend(tokens[:accepted])  # already computed: their blocks may be registered
            self.kv.cache_full_blocks(seq, item.start)
            del seq.token_ids[len(seq.token_ids) - accepted :]
            for t in tokens:
                seq.token_ids.append(t)
                reason = self._finish_reason(seq, t)
                new_tokens.append((seq, t, reason))
                if reason is not None:
                    self.finish(seq, reason)
                    break
        return new_tokens

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Finish (or abort) a sequence wherever it is and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
