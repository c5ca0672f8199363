"""The tokenizer version hash: the backend announces it, the gateway checks an export against it.

It covers the pre-tokenizer pattern, every (bytes, rank) and every special token, so two tokenizers that could
split or number any text differently never share a version (and so never share a `tokens`-level key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def tokenizer_version(pattern: str, ranks: Mapping[bytes, int], special_tokens: Mapping[str, int]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(b"tokenizer.v1\0")
    h.update(pattern.encode())
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        h.update(b"\0%d:" % rank)
        h.update(token)
    for text, token_id in sorted(special_tokens.items(), key=lambda kv: kv[1]):
        h.update(b"\1%d:" % token_id)
        h.update(text.encode())
    return "tok-" + h.hexdigest()
