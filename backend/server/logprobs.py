"""Engine logprobs -> OpenAI's two shapes: chat's `logprobs.content[]` and completions' parallel lists.

Token strings are each token's own bytes decoded as UTF-8 with replacement (a token that splits a character
shows U+FFFD; its `bytes` are exact); completions' `text_offset` counts those strings' characters from the start
of the choice's text (after the echoed prompt, when `echo` is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.engine.logprobs import TokenLogprobs
from backend.tokenizer import Tokenizer


class LogprobRenderer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._encoding = tokenizer.encoding

    def token_bytes(self, token_id: int) -> bytes:
        try:
            return self._encoding.decode_single_token_bytes(token_id)
        except KeyError:  # an id with no bytes (a placeholder for a byte the vocabulary lacks)
            return b""

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def chat(self, tokens: Sequence[TokenLogprobs]) -> dict[str, Any]:
        """`choices[].logprobs` of a chat completion (or of one chunk)."""
        content = [
            {**self._entry(t.token_id, t.logprob), "top_logprobs": [self._entry(i, lp) for i, lp in t.top]}
            for t in tokens
        ]
        return {"content": content, "refusal": None}

    def completion(self, tokens: Sequence[TokenLogprobs], offset: int) -> tuple[dict[str, Any], int]:
        """`choices[].logprobs` of a text completion (or of one chunk), and the offset after its tokens."""
        strings, offsets = [], []
        for t in tokens:
            text = self.token_bytes(t.token_id).decode("utf-8", errors="replace")
            strings.append(text)
            offsets.append(offset)
            offset += len(text)
        top = [{self.token_bytes(i).decode("utf-8", errors="replace"): lp for i, lp in t.top} for t in tokens]
        body = {
            "tokens": strings,
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": top,
            "text_offset": offsets,
        }
        return body, offset
