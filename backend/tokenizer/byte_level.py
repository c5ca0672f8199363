"""Byte-level BPE vocabularies (GPT-2 style) turned into tiktoken mergeable ranks.

Hugging Face and llama.cpp store byte-level BPE tokens as printable unicode strings (GPT-2's
`bytes_to_unicode` table). tiktoken wants raw bytes and merges by *rank of the merged token*, while
those tokenizers merge by *merge-list index*. The two agree when the token created by merge i has an
id that grows with i; `ranks_from_byte_level_vocab` checks that and refuses a vocabulary where it
does not hold rather than tokenize differently from the model's own tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@cache
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(token: str) -> bytes:
    """Raw bytes of a byte-level token string (`'Ġthe'` -> `b' the'`)."""
    table = unicode_to_bytes()
    try:
        return bytes(table[c] for c in token)
    except KeyError as exc:
        raise ValueError(f"token {token!r} is not a byte-level BPE token") from exc


@dataclass(frozen=True, slots=True)
class ByteLevelRanks:
    """tiktoken ranks for a byte-level vocabulary.

    `mergeable_ranks` covers all 256 single bytes: bytes the vocabulary lacks get placeholder ranks at
    or above `vocab_size` (listed in `placeholder_ids`) so tiktoken can run; the tokenizer drops
    them from its output, as llama.cpp does for a byte with no token.
    """

    mergeable_ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    placeholder_ids: frozenset[int]
    vocab_size: int


def ranks_from_byte_level_vocab(
    tokens: Sequence[str],
    merges: Sequence[str] | Sequence[tuple[str, str]],
    special_ids: Mapping[str, int],
) -> ByteLevelRanks:
    """Build tiktoken ranks where rank == token id; `special_ids` are kept out of the merge table."""
    vocab_size = len(tokens)
    special_id_set = set(special_ids.values())
    ranks: dict[bytes, int] = {}
    for token_id, token in enumerate(tokens):
        if token_id in special_id_set:
            continue
        raw = token_bytes(token)
        if raw in ranks:
            raise ValueError(f"duplicate token bytes {raw!r} at ids {ranks[raw]} and {token_id}")
        ranks[raw] = token_id
    _check_merge_order(ranks, merges)
    placeholders: list[int] = []
    for b in range(256):
        if bytes([b]) not in ranks:
            placeholder = vocab_size + len(placeholders)
            ranks[bytes([b])] = placeholder
            placeholders.append(placeholder)
    return ByteLevelRanks(
        mergeable_ranks=ranks,
        special_tokens=dict(special_ids),
        placeholder_ids=frozenset(placeholders),
        vocab_size=vocab_size,
    )


def _check_merge_order(ranks: Mapping[bytes, int], merges: Sequence[str] | Sequence[tuple[str, str]]) -> None:
    previous = -1
    for index, merge in enumerate(merges):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = token_bytes(left) + token_bytes(right)
        token_id = ranks.get(merged)
        if token_id is None:
            raise ValueError(f"merge {index} ({merge!r}) makes a token that is not in the vocabulary")
        if token_id <= previous:
            raise ValueError(
                f"merge {index} ({merge!r}) makes id {token_id} after id {previous}: merge order differs "
                "from token ids, which a rank-ordered (tiktoken) encoder cannot reproduce"
            )
        previous = token_id
