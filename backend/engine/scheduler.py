"""The scheduler: which sequences advance this step and by how many tokens.

Policy (vLLM v1 style, one token budget for prefill and decode alike): running sequences first,
decodes before prefill chunks, each taking what it still needs (1 token for a decode, the rest of its
prompt in chunks for a prefill); then waiting sequences while the budget, `max_num_seqs` and the pool
allow. When a running sequence cannot get a block, the most recently admitted running sequence not yet
scheduled this step is preempted by recompute: its blocks are freed and it goes back to the front of the waiting queue (its full blocks stay
cached, so the recompute is often a prefix hit). No new admissions happen in a step that preempted.

Speculative drafts (backend/engine/speculative.py) are proposed before scheduling and travel on the step
(`ScheduledSeq.draft`), never in `seq.token_ids`: the scheduler grants each decode the drafts the budget leaves
once every decode has its one token, so a verify always runs whole, and postprocess appends the tokens the
verify yields exactly once. `token_ids` (and so every block hash) only ever holds the sequence's real tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from backend.engine.config import EngineConfig
from backend.engine.embedding import EmbeddingSequence
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus

NewToken = tuple[Sequence, int, FinishReason | None]  # a sequence, a token it gained, and why it finished


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # the chunk's tokens, drafts included
    start: int  # num_computed_tokens when scheduled: the first new token's position
    draft: tuple[int, ...] = ()  # speculative tokens after seq.token_ids that this (decode) step verifies

    @property
    def end(self) -> int:
        """The position after the chunk's last token (a draft's, when it verifies drafts)."""
        return self.start + self.num_new_tokens

    @property
    def input_ids(self) -> list[int]:
        """The tokens this chunk runs: its part of `seq.token_ids`, then the drafts it verifies."""
        return [*self.seq.token_ids[self.start : self.end - len(self.draft)], *self.draft]

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so its last logits give the next token."""
        reaches_end = self.end == self.seq.num_tokens + len(self.draft)
        return reaches_end and not isinstance(self.seq, EmbeddingSequence)

    @property
    def pools(self) -> bool:
        """Whether this is the last chunk of an embedding sequence: its last hidden state is the result."""
        return self.end == self.seq.num_tokens and isinstance(self.seq, EmbeddingSequence)


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

    def schedule(self, drafts: Mapping[Sequence, Seq[int]] | None = None) -> list[ScheduledSeq]:
        """This step's chunks within the token budget. `drafts`: proposed speculative tokens per running decode
        (its last token is its only one left to compute); each chunk carries the drafts granted to it."""
        budget = self.config.max_num_batched_tokens
        scheduled, preempted = self._schedule_running(budget, self._grant(drafts or {}, budget))
        budget -= sum(item.num_new_tokens for item in scheduled)
        if not preempted:
            self._admit_waiting(budget, scheduled)
        return scheduled

    def _grant(self, drafts: Mapping[Sequence, Seq[int]], budget: int) -> dict[int, tuple[int, ...]]:
        """The drafts each decode verifies (by id), in running order, while every decode keeps its one token."""
        decodes = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        assert all(s.num_tokens - s.num_computed_tokens == 1 for s in drafts), "drafts follow a decode"
        room = budget - len(decodes)
        granted: dict[int, tuple[int, ...]] = {}
        for seq in decodes:
            draft = tuple(drafts.get(seq, ())[: max(room, 0)])
            room -= len(draft)
            if draft:
                granted[id(seq)] = draft
        return granted

    def _schedule_running(
        self, budget: int, granted: Mapping[int, tuple[int, ...]]
    ) -> tuple[list[ScheduledSeq], bool]:
        """The running sequences' chunks, decodes first; whether a sequence was preempted for blocks."""
        scheduled: list[ScheduledSeq] = []
        taken: set[int] = set()  # ids of sequences scheduled this step: never preempted
        preempted = False
        # decodes first (stable sort), so a long prefill chunk never starves the streams already running
        # (a decode verifying speculative drafts is still a decode: it comes first, whole)
        for seq in sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted as a victim earlier in this loop
            draft = granted.get(id(seq), ())
            wanted = seq.num_tokens - seq.num_computed_tokens + len(draft)
            num_new = min(wanted, budget)
            assert num_new > 0, f"running {seq} has nothing to compute"
            assert num_new == wanted or not draft, "a verify was cut by the budget"
            while not self.kv.allocate(seq, num_new):
                # the most recently admitted sequence not yet scheduled this step (possibly seq itself)
                victim = next(s for s in reversed(self.running) if id(s) not in taken)
                self.running.remove(victim)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens, draft))
                taken.add(id(seq))
                budget -= num_new
        return scheduled, preempted

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledSeq]) -> None:
        """Admit waiting sequences (their cached prefix first) while the budget, max_num_seqs and the pool allow."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hit = self.kv.match_prefix(seq)  # full blocks, then a partial block's rows: token-granular
            num_new = min(seq.num_tokens - hit.num_tokens, budget)
            if not self.kv.allocate(seq, num_new, hit):
                break
            num_cached = seq.num_computed_tokens  # the hit, less a partial the pool was too tight to copy
            self.waiting.popleft()
            if not seq.admitted:
                seq.admitted = True
                seq.num_cached_tokens = num_cached
            self.prefix_hit_tokens_total += num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(seq)

    def postprocess(
        self, scheduled: Iterable[ScheduledSeq], sampled: Iterable[int | list[int] | None]
    ) -> list[NewToken]:
        """Advance computed counts, register full blocks, append sampled tokens; returns each new token.

        A chunk that verified drafts (`ScheduledSeq.draft`) gets a list: the accepted drafts then the pick
        after them. Tokens after a finishing one are dropped.
        """
        new_tokens: list[NewToken] = []
        for item, token in zip(scheduled, sampled, strict=True):
            tokens = [] if token is None else [token] if isinstance(token, int) else token
            new_tokens.extend(self._advance(item, tokens))
        return new_tokens

    def _advance(self, item: ScheduledSeq, tokens: Seq[int]) -> list[NewToken]:
        """Append the chunk's new tokens once (up to a finishing one); count as computed the tokens whose KV the
        chunk wrote (a rejected draft's slot is overwritten later), register the blocks filled, then finish."""
        seq = item.seq
        accepted = len(tokens) - 1 if item.draft else 0  # verified drafts: the tokens they proposed are real
        computed = item.end - len(item.draft) + accepted
        out: list[NewToken] = []
        reason: FinishReason | None = None
        for t in tokens:
            seq.token_ids.append(t)
            reason = self._finish_reason(seq, t)
            out.append((seq, t, reason))
            if reason is not None:
                break
        # a finish inside the accepted drafts drops the rest: only the sequence's own tokens count (and hash)
        seq.num_computed_tokens = min(computed, seq.num_tokens)
        self.kv.cache_full_blocks(seq, item.start)
        if reason is not None:
            self.finish(seq, reason)
        return out

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
