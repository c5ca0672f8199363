"""What each engine really keeps of the prefixes it was sent, learnt from its answers (the cost policy's reuse).

The affinity table says which prompt prefixes the router sent to which engine (`matched_tokens`); whether the
engine still holds one when the next request sharing it arrives is the engine's business. Ours, vLLM and
llama-server with its default host-memory prompt cache keep them; llama-server with `--cache-ram 0` keeps only
the last prompt of each slot, so on a one-slot engine every other prefix is gone by the next request, and a cost
policy trusting the table queues for reuse that never happens. The answers say what was reused: every engine
reports its prompt tokens and the cached ones (`usage.prompt_tokens_details.cached_tokens`, in JSON bodies, in the
final usage chunk of an SSE stream, and in our binary transport's usage frame; llama-server also in `timings`,
`cache_n` beside `prompt_n`, which is read where the usage has no detail).

`UsageTap` finds those numbers in an answer as it passes, never holding or delaying a chunk: per chunk it looks
for the two marker strings (in the chunk, and across its boundary with the last one) and keeps a few hundred bytes
of tail; only from a chunk that holds a marker on does it keep the bytes (bounded), which `reuse` reads once, when
the answer is over. JSON escapes a quote inside a string, so generated text that spells a marker never matches.

Each answer whose request the router expected to reuse something (matched > 0) is one sample: the share of the
prompt the engine reused (its cached tokens over its prompt tokens) over the share the router expected (matched
over the prompt's estimated tokens), clamped to [0, 1]. Shares rather than token counts, because a text prompt's
size is estimated (characters / 4) and the engine counts in its own tokens, template included; on the binary
token path the two prompts are the same ids. `Retention` is an exponentially weighted mean of the samples,
starting at 1.0 (the table trusted, as before; an engine that reports no cached tokens stays there) with each
sample weighing ALPHA = 0.2: the starting value counts as about four answers of evidence, five answers that
reused nothing bring it to 0.33 and ten to 0.11, and it recovers as fast (ten answers that reused everything bring
0.11 back to 0.90). Evidence keeps coming after it fell: the table still records every prefix sent, so requests
still reach engines expected to hold part of their prompt (the cost policy then balances like least-loaded, and
half of a group's requests land on the engine it was sent to before); if the engine keeps them again, the value
climbs back. A batching engine sent two requests of a new prefix at once reuses nothing for the second (the first
has not computed it yet): one such sample costs 0.2 for a few answers, which is what that reuse was worth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CACHED = b'"cached_tokens"'  # usage.prompt_tokens_details (OpenAI, vLLM, SGLang, llama-server, our backend)
CACHE_N = b'"cache_n"'  # llama-server's timings
TAIL = 256  # bytes kept before a marker's chunk: the usage object's prompt_tokens comes before its details
HOLD_BYTES = 64 * 1024  # kept from a marker's chunk on (the usage is in an answer's last event)
ALPHA = 0.2  # the weight of each answer in the retention estimate

_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')
_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d+)')  # llama-server: prompt tokens computed, cached excluded


@dataclass(frozen=True, slots=True)
class Reuse:
    """What one answer says the engine reused: cached prompt tokens, of `prompt` (None: it did not say)."""

    cached: int
    prompt: int | None


def _last(pattern: re.Pattern[bytes], data: bytes) -> int | None:
    found = None
    for found in pattern.finditer(data):  # noqa: B007 (the last match is wanted)
        pass
    return int(found.group(1)) if found is not None else None


def reuse_of(data: bytes) -> Reuse | None:
    """The last reported reuse in `data` (a whole answer, or the bytes kept from its usage on); None if none."""
    if CACHED in data:
        cached = _last(_CACHED, data)
        if cached is not None:
            return Reuse(cached, _last(_PROMPT, data))
    if CACHE_N in data:
        cached = _last(_CACHE_N, data)
        if cached is not None:
            computed = _last(_PROMPT_N, data)
            return Reuse(cached, None if computed is None else cached + computed)
    return None


class UsageTap:
    """Watches the chunks of one answer as they pass (`feed`) and says its reuse at the end (`reuse`)."""

    __slots__ = ("_held", "_size", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._held: list[bytes] | None = None  # from the last chunk with a marker on (and the tail before)
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if CACHED in chunk or CACHE_N in chunk or self._split(CACHED, chunk) or self._split(CACHE_N, chunk):
            self._held, self._size = [self._tail, chunk], len(chunk)
        elif self._held is not None and self._size < HOLD_BYTES:
            self._held.append(chunk)
            self._size += len(chunk)
        self._tail = chunk[-TAIL:] if len(chunk) >= TAIL else (self._tail + chunk)[-TAIL:]

    def _split(self, marker: bytes, chunk: bytes) -> bool:
        """`marker` across the boundary: its length less one on either side holds it only if it crosses."""
        n = len(marker) - 1
        return bool(self._tail) and marker in self._tail[-n:] + chunk[:n]

    def reuse(self) -> Reuse | None:
        return None if self._held is None else reuse_of(b"".join(self._held))


def sample(matched: int, prompt: int, reuse: Reuse) -> float | None:
    """The share of what the router expected (`matched` of `prompt` tokens, its estimate) that the engine reused,
    in [0, 1]; None when nothing was expected (no evidence either way)."""
    if matched <= 0 or prompt <= 0:
        return None
    if reuse.prompt:
        kept = (reuse.cached / reuse.prompt) / min(matched / prompt, 1.0)
    else:  # the engine said what it reused but not of how much: compare the counts
        kept = reuse.cached / matched
    return min(max(kept, 0.0), 1.0)


@dataclass(slots=True)
class Retention:
    """One engine's share of expected prefix reuse that it delivers (see the module doc): 1.0 until answers say
    otherwise; the cost policy counts `matched_tokens x value` as its reuse."""

    value: float = 1.0
    samples: int = 0

    def observe(self, matched: int, prompt: int, reuse: Reuse | None) -> bool:
        """One answer's evidence; False when it carried none (no reuse reported, or nothing was expected)."""
        kept = None if reuse is None else sample(matched, prompt, reuse)
        if kept is None:
            return False
        self.samples += 1
        self.value += ALPHA * (kept - self.value)
        return True
