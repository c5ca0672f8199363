"""The synchronous engine: the step loop (draft ->) schedule -> run -> postprocess, driven by AsyncEngine's thread.

With speculation on (`EngineConfig.draft_tokens` > 0), running greedy decodes get prompt-lookup drafts proposed
before scheduling (backend.engine.speculative); the scheduler grants what the step's budget allows and the drafts
ride on the scheduled step (`ScheduledSeq.draft`), never in `seq.token_ids`. Rows that process their logits or
want logprobs never speculate (`SamplingParams.speculates`).

Not thread-safe: exactly one thread calls it. Tests use it directly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq

import torch

from backend.attention.selector import make_attention_backend
from backend.engine.block_pool import BlockPool
from backend.engine.config import EngineConfig
from backend.engine.cuda_graphs import CudaCapture, build_decode_graphs
from backend.engine.embedding import EmbeddingOut, EmbeddingSequence
from backend.engine.errors import InvalidRequestError
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.model_runner import ModelRunner
from backend.engine.outputs import EngineStats, StepOutput, TokenOut
from backend.engine.prompt import PromptLimits, ValidPrompt
from backend.engine.sampling import SamplingParams, make_generator
from backend.engine.scheduler import ScheduledSeq, Scheduler
from backend.engine.sequence import Sequence
from backend.engine.speculative import ProbeYield, RowCost, SpeculativeConfig, propose
from backend.model.llama import LlamaModel
from backend.model.tiling_store import TilingStore

Sampled = int | list[int] | None  # per scheduled sequence: a token, accepted drafts + a token, or nothing

# a request keeps speculating while at least this share of its drafts is accepted (checked after a probe), or
# the measured break-even share where a row costs more (speculative.RowCost)
_PROBE_DRAFTS = 8
_MIN_ACCEPTANCE = 0.3


class LLMEngine:
    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        eos_token_ids: frozenset[int],
        tilings: TilingStore | None = None,
    ) -> None:
        """`tilings`: where the batch-invariant row tilings of an earlier start are kept (None: measure them)."""
        mc = model.config
        if config.max_model_len > mc.max_position_embeddings:
            raise ValueError(f"max_model_len {config.max_model_len} > model's {mc.max_position_embeddings}")
        if model.device.type != torch.device(config.device).type:
            raise ValueError(f"model is on {model.device}, engine configured for {config.device}")
        self.model = model
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.pool = BlockPool(
            config.num_blocks,
            config.block_size,
            mc.num_layers,
            mc.num_kv_heads,
            mc.head_dim,
            model.dtype,
            model.device,
        )
        self.attention = make_attention_backend(
            config.attention,
            num_heads=mc.num_heads,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            block_size=config.block_size,
            device=model.device,
            dtype=model.dtype,
            batch_invariant=config.batch_invariant,
        )
        if config.batch_invariant:
            if model.device.type == "cuda":
                _fix_cuda_gemm_config()
            # measured (or read back from `tilings`) once per model, before the first step
            model.calibrate_invariance(tilings)
        self.scheduler = Scheduler(
            config, KVCacheManager(self.pool, config.enable_prefix_caching), eos_token_ids
        )
        self.runner = ModelRunner(model, self.pool, self.attention, config.batch_invariant, eos_token_ids)
        if config.cuda_graphs:  # after calibration: a capture must find every tiling measured
            capture = CudaCapture(model.device)
            self.runner.graphs = build_decode_graphs(model, self.pool, self.attention, config, capture)
        self._seqs: dict[str, Sequence] = {}
        self.prefill_tokens_total = 0
        self.generated_tokens_total = 0
        self.speculative = SpeculativeConfig(num_tokens=config.draft_tokens)
        self.spec_verify_steps_total = 0
        self.spec_draft_tokens_total = 0
        self.spec_accepted_tokens_total = 0
        self._spec_tally: dict[str, tuple[int, int]] = {}  # request id -> (drafted, accepted) so far
        self._probes: dict[str, bool] = {}  # request id -> whether it probes, decided once (ProbeYield)
        self.probe_yield = ProbeYield()  # what recent requests got from drafting
        self.row_cost = RowCost()  # what a verify's extra rows cost here, from the decode steps' own times
        self.prompt_limits = PromptLimits(mc.vocab_size, config.max_model_len)

    def prompt(self, ids: Seq[int]) -> ValidPrompt:
        """`ids` checked against this engine's vocabulary and max_model_len, for callers without a server in
        front (tests, benchmarks); raises InvalidPromptError. Reads only immutable state: any thread may call it."""
        return self.prompt_limits.validate(ids)

    def add_request(self, request_id: str, prompt: ValidPrompt, params: SamplingParams) -> Sequence:
        self._check_new_id(request_id)
        seq = Sequence(request_id, prompt.ids, params, make_generator(params, self.model.device))
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def add_embedding(self, request_id: str, prompt: ValidPrompt) -> EmbeddingSequence:
        """Queue a prefill-only request whose result is its pooled last hidden state (one EmbeddingOut)."""
        self._check_new_id(request_id)
        seq = EmbeddingSequence(request_id, prompt.ids)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def _check_new_id(self, request_id: str) -> None:
        if request_id in self._seqs:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")

    def abort_request(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        self._end_drafting(request_id)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[StepOutput]:
        batch = self._schedule()
        if not batch:
            return []
        started = time.perf_counter()
        sampled = self.runner.run(batch)
        if self.speculative.num_tokens and all(_decodes(item) for item in batch):
            self.row_cost.record(sum(item.num_new_tokens for item in batch), time.perf_counter() - started)
        return self._postprocess(batch, sampled)

    def _schedule(self) -> list[ScheduledSeq]:
        """This step's batch; with speculation, greedy decodes carry the drafts the scheduler granted them."""
        return self.scheduler.schedule(self._propose_drafts() if self.speculative.num_tokens else None)

    def _postprocess(self, batch: Seq[ScheduledSeq], sampled: Seq[Sampled]) -> list[StepOutput]:
        """Count the step, advance the sequences, and hand back each new token and finished embedding."""
        self._count(batch, sampled)
        new_tokens = self.scheduler.postprocess(batch, sampled)
        self.generated_tokens_total += len(new_tokens)
        outputs = []
        for seq, token, reason in new_tokens:
            assert reason != "abort"
            out = TokenOut(token, reason, seq.num_prompt_tokens, seq.num_cached_tokens, seq.step_logprobs)
            seq.step_logprobs = None
            outputs.append(StepOutput(seq.request_id, out))
            if reason is not None:
                del self._seqs[seq.request_id]
                self._end_drafting(seq.request_id)
        outputs.extend(self._finish_embeddings(batch))
        return outputs

    def _count(self, batch: Seq[ScheduledSeq], sampled: Seq[Sampled]) -> None:
        """Prefill and speculation counters, read before postprocess moves the sequences on."""
        for item, got in zip(batch, sampled, strict=True):
            seq = item.seq
            if item.draft:
                assert isinstance(got, list)
                self.spec_verify_steps_total += 1
                self.spec_draft_tokens_total += len(item.draft)
                self.spec_accepted_tokens_total += len(got) - 1
                drafted, accepted = self._spec_tally.get(seq.request_id, (0, 0))
                self._spec_tally[seq.request_id] = (drafted + len(item.draft), accepted + len(got) - 1)
            elif not (
                item.num_new_tokens == 1 and seq.num_output_tokens > 0 and item.start == seq.num_tokens - 1
            ):
                self.prefill_tokens_total += item.num_new_tokens

    def _finish_embeddings(self, batch: Seq[ScheduledSeq]) -> list[StepOutput]:
        """Finish the embedding sequences whose last chunk ran this step (the runner stored their state)."""
        outputs = []
        for item in batch:
            if not item.pools:
                continue
            seq = item.seq
            assert isinstance(seq, EmbeddingSequence) and seq.embedding is not None
            self.scheduler.finish(seq, "stop")  # frees its blocks; the full ones stay cached for reuse
            del self._seqs[seq.request_id]
            vector = seq.embedding.to("cpu")  # [hidden] fp32
            seq.embedding = None
            out = EmbeddingOut(vector, seq.num_prompt_tokens, seq.num_cached_tokens)
            outputs.append(StepOutput(seq.request_id, out))
        return outputs

    def _propose_drafts(self) -> dict[Sequence, list[int]]:
        """Prompt-lookup drafts for the running greedy decodes, as many as the request may still use (the
        scheduler trims them to the step's budget)."""
        spec = self.speculative
        drafts: dict[Sequence, list[int]] = {}
        for seq in self.scheduler.running:
            if seq.num_computed_tokens != seq.num_tokens - 1 or isinstance(seq, EmbeddingSequence):
                continue  # not a decode (an embedding's last prompt token drafts nothing)
            if not seq.params.speculates or not self._drafts_pay(seq):
                continue
            left = min(
                seq.params.max_tokens - seq.num_output_tokens, self.config.max_model_len - seq.num_tokens
            )
            k = min(spec.num_tokens, left - 1)
            proposed = propose(seq.token_ids, k, spec.max_ngram, spec.min_ngram) if k > 0 else []
            if proposed:
                drafts[seq] = proposed
        return drafts

    def _drafts_pay(self, seq: Sequence) -> bool:
        """Keep drafting for a request while its drafts pay: after `_PROBE_DRAFTS` drafted tokens, only at an
        acceptance of at least the break-even share (a rejected draft costs a wider forward for nothing): the
        measured cost of a row (`RowCost`), never below `_MIN_ACCEPTANCE`. Whether it probes at all is decided
        once, by how often drafting paid recent requests (`ProbeYield`)."""
        drafted, accepted = self._spec_tally.get(seq.request_id, (0, 0))
        probes = self._probes.get(seq.request_id)
        if probes is None:  # decided once, on what recent requests got from drafting
            probes = self._probes[seq.request_id] = self.probe_yield.probes()
        if not probes:
            return False
        if drafted < _PROBE_DRAFTS:  # a probe, unless no draft can pay here (a row costs a whole step)
            return self.row_cost.marginal is None or self.row_cost.marginal < 1.0
        return accepted >= self.row_cost.break_even(_MIN_ACCEPTANCE) * drafted

    def _end_drafting(self, request_id: str) -> None:
        """A request is done: whether its drafting paid joins `probe_yield`."""
        drafted, accepted = self._spec_tally.pop(request_id, (0, 0))
        self.probe_yield.record(drafted, accepted, self.row_cost.break_even(_MIN_ACCEPTANCE))
        self._probes.pop(request_id, None)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            blocks_total=self.pool.num_blocks,
            blocks_free=self.pool.num_free_blocks,
            blocks_cached=self.pool.num_cached_blocks,
            prefix_hit_tokens_total=self.scheduler.prefix_hit_tokens_total,
            prefill_tokens_total=self.prefill_tokens_total,
            generated_tokens_total=self.generated_tokens_total,
            spec_verify_steps_total=self.spec_verify_steps_total,
            spec_draft_tokens_total=self.spec_draft_tokens_total,
            spec_accepted_tokens_total=self.spec_accepted_tokens_total,
            max_running=self.config.max_num_seqs,
        )

    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion together; the output token ids of each (a convenience for tests)."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [f"generate-{id(self)}-{i}" for i in range(len(prompts))]
        seqs = [
            self.add_request(rid, self.prompt(p), sp)
            for rid, p, sp in zip(ids, prompts, per_prompt, strict=True)
        ]
        while any(not s.is_finished for s in seqs):
            self.step()
        return [s.output_token_ids for s in seqs]


def _fix_cuda_gemm_config() -> None:
    """cuBLAS: no TF32 and no reduced-precision split-K reductions, so a GEMM shape maps to one exact kernel
    configuration (the row tiling then fixes the shapes). Process-wide torch settings."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def _decodes(item: ScheduledSeq) -> bool:
    """A decode row, with or without drafts (not a prefill chunk, not an embedding): the steps RowCost times."""
    seq = item.seq
    return (
        not isinstance(seq, EmbeddingSequence)
        and item.start == seq.num_tokens - 1
        and item.num_new_tokens == 1 + len(item.draft)
    )
