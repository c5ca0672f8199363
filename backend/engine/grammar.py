"""Grammar-constrained decoding with llguidance: compiled grammars, cached, and one matcher per sequence.

Why llguidance rather than xgrammar (measured on SmolLM2's 49,152-token vocabulary, 2 cores): it has no Python
dependencies (xgrammar imports transformers and pulls triton), compiles a JSON schema in about 0.5 ms (xgrammar
5-8 ms) and computes a token mask in 20-50 us on average (xgrammar 4-9 us); both are far below one decode step,
so compile cost and footprint decide.

A `CompiledGrammar` holds a pristine matcher; each sequence gets a deep copy (`new_matcher`), advanced only by
its own sampled tokens, so a row's mask depends on that row alone and batching cannot change it. Compiled
grammars are kept in an LRU bounded by the bytes of their canonical keys and grammar text.

An object's properties are generated in the order the schema declares them, as OpenAI documents for structured
outputs (and xgrammar, llguidance and outlines do): `{"name", "country"}` is answered `{"name":...,"country":...}`.
So two schemas that differ only in member order are two grammars with two answers, and the gateway keys them apart
(gateway.keys.canonical keeps key order inside schemas). A grammar is cached under the schema's JSON as given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance
import orjson
import torch

from backend.tokenizer import Tokenizer

MAX_CACHE_BYTES = 16 * 1024 * 1024
_BITS = torch.arange(32, dtype=torch.int32)


class GrammarError(ValueError):
    """The grammar (a JSON schema) cannot be compiled; the message says why."""


class GrammarMatcher:
    """One sequence's position in its grammar."""

    __slots__ = ("_matcher", "_words")

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)  # [ceil(V/32)] bitmask

    def allowed(self, vocab_size: int) -> torch.Tensor:
        """[vocab_size] bool: the tokens the grammar allows next (EOS only once it is complete); ids past the
        tokenizer's vocabulary (a model's padded rows) are never allowed."""
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        bits = ((words.unsqueeze(-1) >> _BITS) & 1).view(-1).bool()  # [W * 32]
        if bits.shape[0] < vocab_size:
            bits = torch.cat((bits, bits.new_zeros(vocab_size - bits.shape[0])))
        return bits[:vocab_size]

    def accept(self, token: int) -> bool:
        return bool(self._matcher.consume_token(token))

    @property
    def failed(self) -> bool:
        return bool(self._matcher.is_error())


class CompiledGrammar:
    __slots__ = ("_matcher", "key", "size_bytes", "vocab_size")

    def __init__(self, key: bytes, matcher: llguidance.LLMatcher, vocab_size: int, size_bytes: int) -> None:
        self.key = key
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.size_bytes = size_bytes

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._matcher.deep_copy(), self.vocab_size)

    def __repr__(self) -> str:
        return f"CompiledGrammar({self.key[:60]!r})"


class GrammarCompiler:
    """JSON schemas -> compiled grammars for one model's vocabulary (built on first use: about 90 ms)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_cache_bytes: int = MAX_CACHE_BYTES) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._ll: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[bytes, CompiledGrammar] = OrderedDict()
        self._cache_bytes = 0
        self.max_cache_bytes = max_cache_bytes
        self.compiled_total = 0

    def json_schema(self, schema: dict[str, Any], strict: bool) -> CompiledGrammar:
        """A grammar for JSON text matching `schema`. Strict: keywords llguidance cannot enforce are an error;
        not strict: they are ignored (`lenient`). Whitespace is compact, so the output's length is the data's."""
        # Member order kept: it is the answer's order.
        key = orjson.dumps({"schema": schema, "strict": strict})
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        options: Any = {"whitespace_flexible": False, "lenient": not strict}
        try:
            text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), text, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        compiled = CompiledGrammar(key, matcher, self._vocab_size, len(key) + len(text))
        self.compiled_total += 1
        self._store(compiled)
        return compiled

    def _store(self, compiled: CompiledGrammar) -> None:
        self._cache[compiled.key] = compiled
        self._cache_bytes += compiled.size_bytes
        while self._cache_bytes > self.max_cache_bytes and len(self._cache) > 1:
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= evicted.size_bytes

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    def __len__(self) -> int:
        return len(self._cache)

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll is None:
            self._ll = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Vocabulary(self._tokenizer, self._vocab_size)),
                n_vocab=self._vocab_size,
                eos_token=sorted(self._tokenizer.eos_token_ids),
            )
        return self._ll


class _Vocabulary:
    """The shape llguidance.TokenizerWrapper reads: each id's bytes, the special ids, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        encoding = tokenizer.encoding
        tokens = [b""] * vocab_size
        for raw, rank in encoding._mergeable_ranks.items():
            if rank < vocab_size:
                tokens[rank] = raw
        special = [i for i in encoding._special_tokens.values() if i < vocab_size]
        for name, rank in encoding._special_tokens.items():
            if rank < vocab_size:
                tokens[rank] = name.encode()
        eos = sorted(tokenizer.eos_token_ids)
        self.tokens: Sequence[bytes] = tokens
        self.special_token_ids = sorted(set(special) | {e for e in eos if e < vocab_size})
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = tokenizer.bos_token_id
        self._encoding = encoding

    def __call__(self, text: bytes) -> list[int]:
        return list(self._encoding._encode_bytes(text))
