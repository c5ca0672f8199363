"""The synchronous engine: the step loop schedule -> run -> postprocess, driven by AsyncEngine's thread.

Not thread-safe: exactly one thread calls it. Tests use it directly.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from backend.attention.selector import make_attention_backend
from backend.engine.block_pool import BlockPool
from backend.engine.config import EngineConfig
from backend.engine.embedding import EmbeddingOut, EmbeddingSequence
from backend.engine.errors import InvalidRequestError
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.model_runner import ModelRunner
from backend.engine.outputs import EngineStats, StepOutput, TokenOut
from backend.engine.sampling import SamplingParams, make_generator
from backend.engine.scheduler import ScheduledSeq, Scheduler
from backend.engine.sequence import Sequence
from backend.model.llama import LlamaModel


class LLMEngine:
    def __init__(self, model: LlamaModel, config: EngineConfig, eos_token_ids: frozenset[int]) -> None:
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
            model.calibrate_invariance()  # measured once per model, before the first step
        self.scheduler = Scheduler(
            config, KVCacheManager(self.pool, config.enable_prefix_caching), eos_token_ids
        )
        self.runner = ModelRunner(model, self.pool, self.attention, config.batch_invariant)
        self._seqs: dict[str, Sequence] = {}
        self.prefill_tokens_total = 0
        self.generated_tokens_total = 0

    def check_prompt(self, prompt_ids: Seq[int]) -> None:
        """Raise InvalidRequestError for a prompt the engine cannot run (reads only immutable config)."""
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt_ids) >= self.config.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.config.max_model_len}"
            )
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")

    def add_request(self, request_id: str, prompt_ids: Seq[int], params: SamplingParams) -> Sequence:
        if request_id in self._seqs:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        self.check_prompt(prompt_ids)
        seq = Sequence(request_id, prompt_ids, params, make_generator(params, self.model.device))
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def add_embedding(self, request_id: str, prompt_ids: Seq[int]) -> EmbeddingSequence:
        """Queue a prefill-only request whose result is its pooled last hidden state (one EmbeddingOut)."""
        if request_id in self._seqs:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        self.check_prompt(prompt_ids)
        seq = EmbeddingSequence(request_id, prompt_ids)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        sampled = self.runner.run(batch)
        for item in batch:
            seq = item.seq
            is_decode = (
                item.num_new_tokens == 1 and seq.num_output_tokens > 0 and item.start == seq.num_tokens - 1
            )
            if not is_decode:
                self.prefill_tokens_total += item.num_new_tokens
        advanced = self.scheduler.postprocess(batch, sampled)
        self.generated_tokens_total += len(advanced)
        outputs = []
        for seq in advanced:
            reason = seq.finish_reason
            assert reason != "abort"
            outputs.append(
                StepOutput(
                    seq.request_id,
                    TokenOut(seq.token_ids[-1], reason, seq.num_prompt_tokens, seq.num_cached_tokens),
                )
            )
            if reason is not None:
                del self._seqs[seq.request_id]
        outputs.extend(self._finish_embeddings(batch))
        return outputs

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
        )

    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion together; the output token ids of each (a convenience for tests)."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [f"generate-{id(self)}-{i}" for i in range(len(prompts))]
        seqs = [self.add_request(rid, p, sp) for rid, p, sp in zip(ids, prompts, per_prompt, strict=True)]
        while any(not s.is_finished for s in seqs):
            self.step()
        return [s.output_token_ids for s in seqs]


def _fix_cuda_gemm_config() -> None:
    """cuBLAS: no TF32 and no reduced-precision split-K reductions, so a GEMM shape maps to one exact kernel
    configuration (the row tiling then fixes the shapes). Process-wide torch settings."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
