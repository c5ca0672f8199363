"""Per-row logit processors and logprobs: each row is changed from its own sequence's history only.

Order, fixed: repetition penalty (over prompt and output tokens, vLLM/HF: a seen token's positive logit is divided
by the penalty, a negative one multiplied), frequency and presence penalties (over output tokens, OpenAI's
formula: logit - frequency x count - presence x [count > 0]), `logit_bias`, then the masks that nothing after
them may lift: EOS and stop tokens before `min_tokens`, and the grammar's allowed set. Logprobs are the
log-softmax of the processed row, before temperature, top-k and top-p: what the greedy pick maximizes.

A row a grammar leaves with no finite logit (the matcher failed) gets EOS alone, so one broken request ends
instead of putting NaN into the sampler and failing the whole step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from backend.engine.logprobs import TokenLogprobs
from backend.engine.sequence import Sequence


@torch.inference_mode()  # the logits are inference tensors: updating them in place needs the mode
def process_logits(logits: torch.Tensor, seqs: Seq[Sequence], eos_token_ids: frozenset[int]) -> None:
    """In place, on the rows whose sequence asks for it. logits: [N, vocab] fp32, one row per seq."""
    assert logits.dim() == 2 and logits.shape[0] == len(seqs)
    for row, seq in enumerate(seqs):
        if seq.params.processes_logits:
            _process_row(logits[row], seq, eos_token_ids)


def _process_row(row: torch.Tensor, seq: Sequence, eos_token_ids: frozenset[int]) -> None:
    # row: [vocab] fp32, a view into the step's logits. Every tensor made here is made on the row's device: CUDA
    # refuses a CPU operand that is not zero-dimensional. No step reads a value back (no host sync per row).
    params, vocab, dev = seq.params, row.shape[0], row.device
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.int64, device=dev)  # [S]
        picked = row[seen]
        row[seen] = torch.where(
            picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty
        )
    if (params.frequency_penalty or params.presence_penalty) and seq.num_output_tokens:
        output = torch.tensor(seq.output_token_ids, dtype=torch.int64, device=dev)  # [O]
        counts = torch.zeros(vocab, device=dev).index_add_(0, output, torch.ones(output.shape, device=dev))
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64, device=dev)
        row[ids] += torch.tensor([b for _, b in params.logit_bias], dtype=row.dtype, device=dev)
    if seq.num_output_tokens < params.min_tokens:
        banned = [t for t in (eos_token_ids | params.stop_token_ids) if t < vocab]
        row[torch.tensor(banned, dtype=torch.int64, device=dev)] = float("-inf")
    if seq.matcher is not None:
        row.masked_fill_(~seq.matcher.allowed(vocab).to(dev), float("-inf"))
        dead = ~torch.isfinite(row).any()  # [] bool: the grammar left nothing
        eos = min(eos_token_ids)
        row.masked_fill_(dead, float("-inf"))
        row[eos] = torch.where(dead, torch.zeros((), device=dev), row[eos])


def token_logprobs(row: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    """The chosen token's logprob and the `top` most likely tokens (descending; masked tokens left out)."""
    # row: [vocab] fp32 processed logits
    logprobs = row.log_softmax(dim=-1)  # [vocab]
    best: list[tuple[int, float]] = []
    if top:
        values, ids = torch.topk(logprobs, top)  # sorted descending
        best = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v != float("-inf")]
    return TokenLogprobs(token, float(logprobs[token]), tuple(best))
